"""The `turbo-llama bench` command: options, the checks before any run, then run.run_bench."""
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


@click.command("bench")
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
def bench_command(model_path, shape, types, depths, backend, n_prompt, n_gen, reps, rounds, threads, repack, out):
    """Speed of each KV-cache type with llama-bench (pp and tg at several depths), ratios to f16."""
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
