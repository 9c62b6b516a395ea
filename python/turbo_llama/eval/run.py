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

from ..build.installed import find_tool, installed_info
from ..cache_types import bits_per_value, check_caches, supported_types
from ..util import sha256_file
from . import model as _model
from . import processes
from .llama_tools import tool_version
from .niah_runs import niah_step, niah_units
from .outputs import publish, staging_dir
from .perplexity import backend_args, perplexity_step
from .progress import WorkBar, ppl_units
from .report import finish_outputs, write_json

QUICK_CTX, QUICK_CHUNKS = 2048, 4
FULL_CHUNKS = 16  # the KLD base logits of Gemma 3 (262k vocab) are ~0.5 GiB per chunk at c=2048


def _version_info(tools: dict[str, Path]) -> dict:
    info: dict = {}
    try:
        import turbo_llama
        info["turbo_llama"] = getattr(turbo_llama, "__version__", None)
    except ImportError:
        pass
    info["build"] = installed_info()   # the build's own record of what was built (pin, patches), if any
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


def run_eval(*, model_path: Path | None, types: list[str], ctx: int, chunks: int,
             text: Path | list[tuple[str, Path]] | None, haystack: Path | None = None,
             niah_lengths: list[int], niah_depths: list[float], backend: str,
             threads: int, out: Path, quick: bool, repack: bool, skip_ppl: bool = False, skip_niah: bool = False,
             progress: bool = True) -> dict:
    """Run the eval into out (see the module's docstring); returns results.json's content. text: one file,
    or (name, file) pairs measured in turn (the first is the primary text), or None (the Jargon File)."""
    tools, types = check_inputs(types, need_ppl=not skip_ppl, need_niah=not skip_niah)
    mpath = Path(model_path) if model_path else _model.default_model()
    if isinstance(text, list):
        texts = [(n, Path(p)) for n, p in text]
    else:
        texts = [(Path(text).stem, Path(text))] if text else [("jargon", _model.jargon_text())]
    ppl_text = texts[0][1]
    hay_text = Path(haystack) if haystack else (None if skip_niah else _model.bible_text())
    bargs = backend_args(backend, threads, repack)
    res = new_results(types=types, model_path=mpath, text=ppl_text, haystack=hay_text, ctx=ctx, chunks=chunks,
                      lengths=niah_lengths, depths=niah_depths, backend=backend, threads=threads, quick=quick,
                      repack=repack, tools=tools)
    res["settings"]["texts"] = {n: str(p) for n, p in texts}
    stage = staging_dir(out)
    logs = stage / "logs"
    logs.mkdir()
    save = lambda: write_json(stage / "results.json", res)  # noqa: E731
    save()
    units = ppl_units(ctx, chunks)
    total = ((0 if skip_ppl else units * len(types) * len(texts))
             + (0 if skip_niah else niah_units(niah_lengths, niah_depths) * len(types)))
    bar = WorkBar(total, enabled=progress)
    t_start = time.monotonic()
    try:
        if not skip_ppl:
            for name, path in texts:
                perplexity_step(res, exe=tools["llama-perplexity"], model=mpath, text=path, ctx=ctx, chunks=chunks,
                                extra=bargs, out=stage, logs=logs, save=save, bar=bar, units=units,
                                sha256_file=sha256_file, text_name=name)
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
