"""`turbo-llama eval`: perplexity, KL divergence and needle-in-a-haystack for each KV cache.

The default is the quick eval (4 chunks at c=2048, needles at 1K-4K tokens); `--full` is 16 chunks and
needles up to the model's training context. The caches are the quality ladder (cache_types.LADDER:
every type and the usual K/V pairs) that the built tools support, or `--types`.

The steps: check the caches, model, texts and tools (before anything is written); perplexity.py (f16
base, then every cache against it); niah_runs.py (needles); report.py (results.md/json, niah.png,
kld.png). Everything is written into <out>.partial and renamed to <out> when the run ends, finished or
interrupted (SIGINT/SIGTERM/SIGHUP: the tools are stopped, what finished is reported, status
"interrupted"); a run that fails leaves no folder and exits non-zero with the tool's reason.
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import click

from . import model as _model
from . import niah as _niah
from . import processes
from .cache_types import CacheTypeError, bits_per_value, check_caches, default_ladder, supported_types
from .llama_tools import ToolError, find_tool, tool_version
from .niah_runs import niah_step, niah_units
from .perplexity import backend_args, kld_base_bytes, perplexity_step  # noqa: F401 (kld_base_bytes: tests)
from .outputs import publish, staging_dir
from .progress import WorkBar, ppl_units
from .report import finish_outputs, render_markdown, write_json  # noqa: F401 (render_markdown: tests)

QUICK_CTX, QUICK_CHUNKS = 2048, 4
FULL_CHUNKS = 16  # the KLD base logits of Gemma 3 (262k vocab) are ~0.5 GiB per chunk at c=2048


def _csv(s: str, conv=str) -> list:
    return [conv(x.strip()) for x in s.split(",") if x.strip()]


def _version_info(tools: dict[str, Path]) -> dict:
    info: dict = {}
    try:
        import turbo_llama
        info["turbo_llama"] = getattr(turbo_llama, "__version__", None)
    except ImportError:
        pass
    try:  # the build toolkit's own record of what was built (pin, patches), if it has one
        from turbo_llama import build as _build
        for name in ("build_info", "installed_info", "installed"):
            fn = getattr(_build, name, None)
            if callable(fn):
                info["build"] = fn()
                break
    except Exception:  # noqa: BLE001 - optional
        pass
    for name, exe in tools.items():
        info[name] = {"path": str(exe), "version": tool_version(exe)}
    return info


def _machine() -> dict:
    return {"platform": platform.platform(), "machine": platform.machine(),
            "processor": platform.processor(), "cpu_count": os.cpu_count(),
            "python": sys.version.split()[0]}


def check_inputs(types: list[str], *, need_ppl: bool = True, need_niah: bool = True) -> tuple[dict[str, Path], list[str]]:
    """The tools, and the caches in run order (f16 first: the KLD base and the needle reference), refused
    before any work when the build lacks a type (the build itself is asked which types it has)."""
    tools = {}
    if need_ppl:
        tools["llama-perplexity"] = find_tool("llama-perplexity")
    if need_niah:
        tools["llama-server"] = find_tool("llama-server")
    supported = supported_types(next(iter(tools.values())))
    names = ["f16", *[t for t in types if t != "f16"]]
    return tools, [c.name for c in check_caches(names, supported)]


def new_results(*, types, model_path, text, haystack, ctx, chunks, lengths, depths, backend, threads, quick,
                repack, tools) -> dict:
    return {
        "schema": 1, "status": "running", "started": _dt.datetime.now().isoformat(timespec="seconds"),
        "version": _version_info(tools), "machine": _machine(),
        "model": {"path": str(model_path), "sha256": _model.model_sha256(model_path)},
        "settings": {"types": types, "ctx": ctx, "chunks": chunks, "text": str(text), "haystack": str(haystack),
                     "niah_lengths": lengths, "niah_depths": depths, "backend": backend, "threads": threads,
                     "quick": quick, "repack": repack},
        "bits_per_value": {t: bits_per_value(t) for t in types},
        "types": types, "commands": [], "ppl": {}, "niah": {}, "niah_results": {}, "niah_raw": {},
        "errors": {}, "timings": {},
    }


def run_eval(*, model_path: Path | None, types: list[str], ctx: int, chunks: int, text: Path | None,
             haystack: Path | None = None, niah_lengths: list[int], niah_depths: list[float], backend: str,
             threads: int, out: Path, quick: bool, repack: bool, skip_ppl: bool = False, skip_niah: bool = False,
             progress: bool = True) -> dict:
    """Run the eval into out (see the module's docstring); returns results.json's content."""
    tools, types = check_inputs(types, need_ppl=not skip_ppl, need_niah=not skip_niah)
    mpath = Path(model_path) if model_path else _model.default_model()
    ppl_text = Path(text) if text else _model.jargon_text()
    hay_text = Path(haystack) if haystack else (None if skip_niah else _model.bible_text())
    bargs = backend_args(backend, threads, repack)
    res = new_results(types=types, model_path=mpath, text=ppl_text, haystack=hay_text, ctx=ctx, chunks=chunks,
                      lengths=niah_lengths, depths=niah_depths, backend=backend, threads=threads, quick=quick,
                      repack=repack, tools=tools)
    stage = staging_dir(out)
    logs = stage / "logs"
    logs.mkdir()
    save = lambda: write_json(stage / "results.json", res)  # noqa: E731
    save()
    units = ppl_units(ctx, chunks)
    total = (0 if skip_ppl else units * len(types)) + (0 if skip_niah else niah_units(niah_lengths, niah_depths) * len(types))
    bar = WorkBar(total, enabled=progress)
    t_start = time.monotonic()
    try:
        if not skip_ppl:
            perplexity_step(res, exe=tools["llama-perplexity"], model=mpath, text=ppl_text, ctx=ctx, chunks=chunks,
                            extra=bargs, out=stage, logs=logs, save=save, bar=bar, units=units,
                            sha256_file=_model.sha256_file)
        if not skip_niah:
            niah_step(res, exe=tools["llama-server"], model=mpath, haystack=hay_text, lengths=niah_lengths,
                      depths=niah_depths, extra=bargs, out=stage, logs=logs, save=save, bar=bar)
        res["status"] = "done"
    except KeyboardInterrupt:
        res["status"] = "interrupted"
        bar.write("interrupted: stopping the tools, keeping what finished")
        raise
    except BaseException as e:
        res["status"] = "failed"
        res["errors"]["_fatal"] = str(e)
        raise
    finally:
        bar.close()
        processes.stop_all()
        res["timings"]["total"] = time.monotonic() - t_start
        res["finished"] = _dt.datetime.now().isoformat(timespec="seconds")
        if res["status"] == "failed":   # no half-written results: the reason goes to the caller
            shutil.rmtree(stage, ignore_errors=True)
        else:
            finish_outputs(res, stage)
            publish(stage, out)
    return res


@click.command("eval")
@click.option("--model", "model_spec", default=None, metavar="NAME|PATH",
              help=f"{' or '.join(_model.MODEL_NAMES)} (fetched and checked once), or a GGUF file "
                   f"[default: {_model.DEFAULT_MODEL}]")
@click.option("--types", default=None, metavar="LIST",
              help="caches, comma separated: TYPE or K/V (e.g. f16,q8_0,turbo3,q8_0/turbo3); f16 always runs "
                   "first (the KLD base) [default: the quality ladder, as far as the build supports it]")
@click.option("--full", is_flag=True, help=f"the full eval: {FULL_CHUNKS} chunks, needles from 1K tokens to the "
                                           "model's training context at 10 depths")
@click.option("--quick", is_flag=True, help="the quick eval (the default; kept for scripts)")
@click.option("--ctx", type=int, default=None, help=f"perplexity context [{QUICK_CTX}]")
@click.option("--chunks", type=int, default=None, help=f"perplexity chunks [quick {QUICK_CHUNKS}, full {FULL_CHUNKS}]")
@click.option("--text", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="perplexity text [the Jargon File, shipped with turbo-llama]")
@click.option("--haystack", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="NIAH haystack text [the King James Bible, shipped with turbo-llama]")
@click.option("--niah-lengths", default=None, help="comma separated token lengths "
              f"[quick: {','.join(map(str, _niah.QUICK_LENGTHS))}; full: 1K..model context]")
@click.option("--niah-depths", default=None, help="comma separated fractions [quick: 0.1,0.5,0.9; full: 10]")
@click.option("--no-niah", "skip_niah", is_flag=True, help="perplexity and KLD only (no needles)")
@click.option("--backend", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--threads", type=int, default=os.cpu_count() or 1, show_default=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="output directory [results/eval-YYYYmmdd-HHMMSS]")
@click.option("--repack/--no-repack", default=None,
              help="CPU weight repacking (default off on cpu: its AMX kernels SIGILL on some VMs)")
@click.option("--skip-ppl", is_flag=True, hidden=True)
def eval_command(model_spec, types, full, quick, ctx, chunks, text, haystack, niah_lengths, niah_depths, skip_niah,
                 backend, threads, out, repack, skip_ppl):
    """Perplexity, KL divergence and needle-in-a-haystack for each KV cache (quick by default; --full)."""
    if full and quick:
        raise click.UsageError("--full and --quick exclude each other")
    try:
        with processes.interruptible():
            _eval_cli(model_spec, types, full, ctx, chunks, text, haystack, niah_lengths, niah_depths, skip_niah,
                      backend, threads, out, repack, skip_ppl)
    except KeyboardInterrupt as e:
        sys.exit(processes.exit_code(e))


def _eval_cli(model_spec, types, full, ctx, chunks, text, haystack, niah_lengths, niah_depths, skip_niah,
              backend, threads, out, repack, skip_ppl):
    try:
        if types is None:
            tools, _ = check_inputs([], need_ppl=not skip_ppl, need_niah=not skip_niah)
            type_list, skipped = default_ladder(supported_types(next(iter(tools.values()))))
            if skipped:
                click.echo(f"note: this build lacks {', '.join(skipped)}: not in the ladder", err=True)
        else:
            type_list = _csv(types)
        check_inputs(type_list, need_ppl=not skip_ppl, need_niah=not skip_niah)   # before any work
        mpath = _model.resolve_model(model_spec)
        ctx = ctx or QUICK_CTX
        chunks = chunks or (FULL_CHUNKS if full else QUICK_CHUNKS)
        if niah_lengths:
            lengths = _csv(niah_lengths, int)
        else:
            lengths = list(_niah.full_lengths(_n_ctx_train(mpath)) if full else _niah.QUICK_LENGTHS)
        depths = _csv(niah_depths, float) if niah_depths else list(_niah.FULL_DEPTHS if full else _niah.QUICK_DEPTHS)
    except (ValueError, CacheTypeError, ToolError, _model.AssetError) as e:
        raise click.ClickException(str(e))
    out = out or Path("results") / f"eval-{_dt.datetime.now():%Y%m%d-%H%M%S}"
    if repack is None:
        repack = backend != "cpu"
    click.echo(f"turbo-llama eval → {out}  ({'full' if full else 'quick'}: {','.join(type_list)}; ctx {ctx}, "
               f"{chunks} chunk(s), " + ("no NIAH" if skip_niah else f"NIAH {len(lengths)}×{len(depths)}")
               + f"; {mpath.name}, {backend}, {threads} threads)",
               err=True)
    try:
        res = run_eval(model_path=mpath, types=type_list, ctx=ctx, chunks=chunks, text=text, haystack=haystack,
                       niah_lengths=lengths, niah_depths=depths, backend=backend, threads=threads, out=out,
                       quick=not full, repack=repack, skip_ppl=skip_ppl, skip_niah=skip_niah)
    except KeyboardInterrupt as e:
        click.echo(f"\ninterrupted ({e}): the finished part is in {out}/results.md", err=True)
        raise
    except (_model.AssetError, ToolError, CacheTypeError) as e:
        raise click.ClickException(f"{e} (no results written)")
    click.echo((out / "results.md").read_text())
    if res.get("errors"):
        raise click.ClickException("some caches failed: " + "; ".join(f"{t}: {m}" for t, m in res["errors"].items()))


def _n_ctx_train(path: Path) -> int:
    try:
        import gguf
        r = gguf.GGUFReader(str(path))
        arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
        f = r.fields[f"{arch}.context_length"]
        return int(f.parts[-1][0])
    except Exception:  # noqa: BLE001
        return 32768


if __name__ == "__main__":  # pragma: no cover
    eval_command()
