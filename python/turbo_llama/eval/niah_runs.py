"""The eval's needle step: the NIAH prompts (niah.py) through llama-server, once per cache type.

One server per cache type (its own process group; stopped after its cells, on failure and on
interrupt). The prompts are built once, with the first server's tokenizer, and every type gets the very
same prompts; the cells run needle-furthest-first so each reuses the previous prompt's cached prefix.
"""
from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Callable

from ..cache_types import parse_cache
from ..errors import ToolError
from . import niah as _niah
from .llama_tools import LlamaServer, UnsupportedCacheType, check_unsupported, parse_kv_cache, tool_reason
from .perplexity import log_name
from .progress import START_UNITS, WorkBar, cell_units, planned_cells


def server_args(name: str, n_ctx: int, extra: list[str]) -> list[str]:
    # --swa-full: the SWA layers keep the whole context too (same attention mask, same numbers), so a
    # prompt can reuse the cached KV of the previous one up to its needle
    return ["-c", str(n_ctx), "-fa", "on", *parse_cache(name).args(), "-np", "1", "-lv", "4", "--no-webui",
            "--swa-full", *extra]


def niah_units(lengths: list[int], depths: list[float]) -> float:
    """The work of one cache type's needle cells (progress.py), server start included."""
    return START_UNITS + sum(cell_units(planned_cells(lengths, depths)))


def niah_step(res: dict, *, exe: Path, model: Path, haystack: Path, lengths: list[int], depths: list[float],
              extra: list[str], out: Path, logs: Path, save: Callable[[], None], bar: WorkBar) -> None:
    """Fills res["niah"], res["niah_results"], res["niah_raw"], res["niah_kv"]; a type whose server fails
    gets its reason in res["errors"] and the others still run."""
    hay = haystack.read_text(errors="replace")
    n_ctx = max(lengths) + _niah.N_PREDICT + 64
    units = cell_units(planned_cells(lengths, depths))
    cells: list[_niah.Cell] | None = None
    for name in res["types"]:
        if name in res.get("unsupported", []):  # already known: do not start a server just to hear it again
            bar.add(START_UNITS + sum(units))
            continue
        bar.describe(f"NIAH {name}: starting llama-server")
        srv = LlamaServer(exe, model, server_args(name, n_ctx, extra), log_path=logs / f"server-{log_name(name)}.log")
        t0 = time.monotonic()
        try:
            srv.start()
        except ToolError as e:
            msg = _start_failure(srv, name, e)
            res["errors"][name] = (res["errors"][name] + "; " if name in res["errors"] else "") + msg
            bar.write(f"[{name}] {msg}")
            res["commands"].append({"step": f"niah:{name}", "cmd": shlex.join(srv.cmd)})
            bar.add(START_UNITS + sum(units))
            save()
            continue
        bar.add(START_UNITS)
        try:
            res["commands"].append({"step": f"niah:{name}", "cmd": shlex.join(srv.cmd)})
            if cells is None:
                bar.describe("NIAH: building prompts")
                try:
                    cells = _niah.build_cells(hay, lengths, depths, srv.tokenize, srv.detokenize)
                except ValueError as e:   # a haystack too short for the lengths asked for
                    raise ToolError(f"NIAH: {e}") from e
                (out / "niah_prompts.json").write_text(json.dumps(
                    [c.to_json(with_prompt=True) for c in cells], indent=1))
                res["niah"] = {"lengths": lengths, "depths": depths, "n_predict": _niah.N_PREDICT,
                               "seed": _niah.SEED, "prompts": "niah_prompts.json",
                               "run_order": _niah.run_order(cells), "cells": [c.to_json() for c in cells]}
            res.setdefault("niah_kv", {})[name] = parse_kv_cache(srv.log_text())
            res["niah_results"][name], res["niah_raw"][name] = {}, []
            for i, c in enumerate(cells[j] for j in _niah.run_order(cells)):
                bar.describe(f"NIAH {name}: {c.length} tokens, depth {c.depth:g}")
                t1 = time.monotonic()
                try:
                    r = srv.post("/completion", _niah.completion_request(c.prompt))
                except (OSError, ValueError) as e:   # the server died or answered garbage: this type's error
                    msg = f"NIAH: llama-server failed at {c.length} tokens, depth {c.depth:g}: {e}: " \
                          f"{tool_reason(srv.log_text())}"
                    res["errors"][name] = (res["errors"][name] + "; " if name in res["errors"] else "") + msg
                    bar.write(f"[{name}] {msg}")
                    bar.add(sum(units[i:]))
                    break
                completion = r.get("content", "")
                ok = _niah.found(c.key, completion)
                res["niah_results"][name][f"{c.length}@{c.depth:g}"] = ok
                res["niah_raw"][name].append({"length": c.length, "depth": c.depth, "key": c.key,
                                              "completion": completion, "found": ok,
                                              "n_prompt_tokens": r.get("tokens_evaluated"),
                                              "seconds": time.monotonic() - t1, "units": units[i]})
                save()
                bar.add(units[i])
        finally:
            srv.stop()
            res["timings"][f"niah:{name}"] = time.monotonic() - t0


def _start_failure(srv: LlamaServer, name: str, e: ToolError) -> str:
    log = srv.log_text()
    try:
        check_unsupported(log, name)
    except UnsupportedCacheType as u:
        return f"NIAH: {u}"
    if "during start:" in str(e):
        return f"NIAH: {e}"
    return f"NIAH: llama-server failed to start: {e}: {tool_reason(log)}"
