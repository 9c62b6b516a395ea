"""The `turbo-llama bench` command (llama-bench speed: options, the checks before any run, then run.run_bench) and
its subcommand `turbo-llama bench serve` (llama-server under concurrent users: serve.run_serve)."""
from __future__ import annotations

import datetime as _dt
import os
import sys
from pathlib import Path

import click

from ..cache_types import BENCH_TYPES, CacheTypeError
from ..errors import ToolError
from ..eval import model as _model
from ..eval import processes
from .run import check_bench_types, parse_type_spec, run_bench
from .shapes import RANDOM_WEIGHTS_WARNING, SHAPES, shape_gguf


@click.group("bench", invoke_without_command=True)
@click.option("--model", "model_path", default=None, metavar="NAME|PATH",
              help="gemma3-270m, qwen2.5-coder-1.5b or a GGUF file (default: gemma3-270m)")
@click.option("--shape", type=click.Choice(sorted(SHAPES)), default=None,
              help="generate a RANDOM-weight GGUF of this real model shape (speed only)")
@click.option("--types", default=",".join(BENCH_TYPES), show_default=True,
              help="cache types; TYPE+NAME=VALUE runs that type with an environment switch, e.g. turbo3+TURBO_PDL=1")
@click.option("--depths", default="0,8192,32768,131072", show_default=True)
@click.option("--backend", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True)
@click.option("-p", "n_prompt", type=int, default=512, show_default=True)
@click.option("-n", "n_gen", type=int, default=128, show_default=True)
@click.option("-r", "--repetitions", "reps", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--rounds", type=click.IntRange(min=1), default=1, show_default=True,
              help="run the sweep over the types this many times, interleaved; ratios to f16 of the same round")
@click.option("--threads", type=int, default=os.cpu_count() or 1, show_default=True)
@click.option("--repack/--no-repack", default=None, help="CPU weight repacking (default: off on cpu)")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="output directory [results/bench-YYYYmmdd-HHMMSS]")
@click.pass_context
def bench_command(ctx, model_path, shape, types, depths, backend, n_prompt, n_gen, reps, rounds, threads, repack, out):
    """Speed of each KV-cache type with llama-bench (pp and tg at several depths), ratios to f16.

    `turbo-llama bench serve --help`: llama-server under many concurrent users."""
    if ctx.invoked_subcommand is not None:   # `bench serve ...`: the subcommand's own options
        return
    if model_path and shape:
        raise click.UsageError("--model and --shape are exclusive")
    type_list = [t.strip() for t in types.split(",") if t.strip()]
    for t in type_list:
        try:
            parse_type_spec(t)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--types")
    if len(set(type_list)) != len(type_list):
        raise click.BadParameter(f"a type is given twice: {types}", param_hint="--types")
    if "f16" in type_list:
        type_list = ["f16", *[t for t in type_list if t != "f16"]]
    try:
        depth_list = [int(d) for d in depths.split(",") if d.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma separated integers: {depths}", param_hint="--depths")
    out = out or Path("results") / f"bench-{_dt.datetime.now():%Y%m%d-%H%M%S}"
    try:
        with processes.interruptible():
            check_bench_types(type_list)   # before anything runs or is written
            if shape:
                s = SHAPES[shape]
                click.echo(f"*** {RANDOM_WEIGHTS_WARNING.format(name=s.note or shape)} ***", err=True)
                mpath = shape_gguf(shape, _model.cache_root() / "shapes")
                too_deep = [d for d in depth_list if d + n_prompt > s.n_ctx_train]
                if too_deep:
                    click.echo(f"note: depths {too_deep} exceed the shape's training context", err=True)
            else:
                mpath = _model.resolve_model(model_path)
            res = run_bench(model_path=mpath, random_shape=shape, types=type_list, depths=depth_list,
                            p=n_prompt, n=n_gen, backend=backend, threads=threads, reps=reps, rounds=rounds,
                            repack=(backend != "cpu") if repack is None else repack, out=out)
    except (_model.AssetError, ToolError, CacheTypeError) as e:
        raise click.ClickException(str(e))
    except KeyboardInterrupt as e:
        click.echo(f"\ninterrupted ({e}); the finished part is in {out}/bench.md", err=True)
        sys.exit(processes.exit_code(e))
    click.echo((out / "bench.md").read_text())
    if shape:
        click.echo(f"*** {res['warning']} ***", err=True)
    if res["errors"]:
        raise click.ClickException("some caches failed: " + "; ".join(f"{t}: {m}" for t, m in res["errors"].items()))


@bench_command.command("serve")
@click.option("--model", "model_path", default=None, metavar="NAME|PATH",
              help="gemma3-270m, qwen2.5-coder-1.5b or a GGUF file (default: gemma3-270m)")
@click.option("--types", default="f16,q8_0,turbo3", show_default=True, help="cache types (TYPE or K/V)")
@click.option("--users", default="1,2,4", show_default=True,
              help="equal slots for every type: the numbers of concurrent users (-np N) to run; '' for none")
@click.option("--budget-gib", type=click.FloatRange(min=0, min_open=True), default=None,
              help="also a fixed KV-cache budget: each type runs with as many slots of --ctx as fit in it")
@click.option("--max-users", type=click.IntRange(min=1), default=256, show_default=True,
              help="at most this many slots in budget mode")
@click.option("--ctx", type=click.IntRange(min=64), default=4096, show_default=True,
              help="context per slot (tokens): -c = users x ctx")
@click.option("--prompt-tokens", type=click.IntRange(min=16), default=512, show_default=True,
              help="tokens of each prompt (a distinct text passage and its key line)")
@click.option("-n", "--n-predict", type=click.IntRange(min=2), default=128, show_default=True,
              help="tokens generated per request")
@click.option("--requests", type=click.IntRange(min=1), default=2, show_default=True,
              help="requests per user, one after another")
@click.option("--time-limit", type=click.FloatRange(min=1), default=300, show_default=True,
              help="seconds per run after which no request starts")
@click.option("--kv-unified/--no-kv-unified", default=False, show_default=True,
              help="one KV buffer for all slots (-kvu) or a stream per slot (-no-kvu)")
@click.option("--check/--no-check", default=True, show_default=True,
              help="run the first wave's prompts alone first and compare (the leakage check runs either way)")
@click.option("--backend", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True)
@click.option("--threads", type=int, default=os.cpu_count() or 1, show_default=True)
@click.option("--repack/--no-repack", default=None, help="CPU weight repacking (default: off on cpu)")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="the server's port (default: a free one)")
@click.option("--server-arg", "server_args", multiple=True, metavar="ARG",
              help="one more llama-server argument (repeatable), e.g. --server-arg=-ub --server-arg=256")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="output directory [results/serve-YYYYmmdd-HHMMSS]")
def serve_command(model_path, types, users, budget_gib, max_users, ctx, prompt_tokens, n_predict, requests,
                  time_limit, kv_unified, check, backend, threads, repack, port, server_args, out):
    """llama-server with N slots per cache type under N concurrent streaming users: aggregate tokens/s, time to
    first token, per-user decode speed, and every answer checked (text, no cross-slot leakage); for equal slots
    (--users) and for a fixed cache budget (--budget-gib). Writes serve.json, serve.md, serve.png into --out."""
    from .serve import ServeSettings, parse_int_list, run_serve
    type_list = list(dict.fromkeys(t.strip() for t in types.split(",") if t.strip()))
    if not type_list:
        raise click.BadParameter("no cache type given", param_hint="--types")
    if "f16" in type_list:
        type_list = ["f16", *[t for t in type_list if t != "f16"]]
    try:
        user_list = parse_int_list(users) if users.strip() else []
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--users")
    if not user_list and not budget_gib:
        raise click.UsageError("nothing to run: give --users, --budget-gib or both")
    if prompt_tokens + n_predict > ctx:
        raise click.BadParameter(f"--prompt-tokens {prompt_tokens} + --n-predict {n_predict} do not fit in a slot "
                                 f"of --ctx {ctx}", param_hint="--ctx")
    out = out or Path("results") / f"serve-{_dt.datetime.now():%Y%m%d-%H%M%S}"
    try:
        with processes.interruptible():
            check_bench_types(type_list)   # before any server starts or anything is written
            mpath = _model.resolve_model(model_path)
            s = ServeSettings(model=mpath, ctx=ctx, prompt_tokens=prompt_tokens, n_predict=n_predict,
                              requests=requests, time_limit=time_limit, kv_unified=kv_unified, backend=backend,
                              threads=threads, repack=(backend != "cpu") if repack is None else repack, check=check,
                              port=port, extra=list(server_args))
            res = run_serve(model_path=mpath, types=type_list, users=user_list, budget_gib=budget_gib, settings=s,
                            out=out, max_users=max_users, argv=_command_line(click.get_current_context()))
    except (_model.AssetError, ToolError, CacheTypeError, ValueError) as e:
        raise click.ClickException(str(e))
    except KeyboardInterrupt as e:
        click.echo(f"\ninterrupted ({e}); the finished part is in {out}/serve.md", err=True)
        sys.exit(processes.exit_code(e))
    click.echo((out / "serve.md").read_text())
    bad = [f"{r['type']} x{r['users']}" for r in res["runs"] if r["check"]["problems"]]
    if res["errors"] or bad:
        msgs = [f"{t}: {m}" for t, m in res["errors"].items()]
        if bad:
            msgs.append(f"answers with problems in {', '.join(bad)} (serve.md lists them)")
        raise click.ClickException("; ".join(msgs) + f"\nlogs: {out}/server-*.log")


def _command_line(ctx: click.Context) -> list[str]:
    """The command as given, options in their long form (defaults left out), for the record."""
    argv = ctx.command_path.split()
    for p in ctx.command.params:
        v = ctx.params.get(p.name)
        if ctx.get_parameter_source(p.name) == click.core.ParameterSource.DEFAULT:
            continue
        name = max(p.opts, key=len)
        if isinstance(p, click.Option) and p.is_flag:
            argv.append(name if v else max(p.secondary_opts, key=len))
        elif isinstance(p, click.Option) and p.multiple:
            argv += [f"{name}={x}" for x in v]
        else:
            argv += [name, str(v)]
    return argv
