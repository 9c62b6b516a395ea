"""`turbo-llama eval`: perplexity + KLD and needle-in-a-haystack for every KV-cache type.

Outputs (in --out): results.json (written after every step), results.md, niah.png, kld.png,
niah_prompts.json (the exact prompts, identical for every type) and logs/ (every tool's output).
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import click

from . import model as _model
from . import niah as _niah
from . import plots
from .llama_tools import (BITS_PER_VALUE, DEFAULT_TYPES, LlamaServer, ToolError,
                          UnsupportedCacheType, check_unsupported, find_tool, finite,
                          parse_kv_cache, tool_version)
from .perplexity import backend_args, cut_text, ppl_command, run_ppl

QUICK_CTX, QUICK_CHUNKS = 2048, 4
FULL_CHUNKS = 16  # the KLD base logits of Gemma 3 (262k vocab) are ~0.5 GiB per chunk at c=2048


def _csv(s: str, conv=str) -> list:
    return [conv(x.strip()) for x in s.split(",") if x.strip()]


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".json.partial")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    tmp.replace(path)


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


def _fmt(x, spec: str, none: str = "–") -> str:
    return format(x, spec) if finite(x) else none


def render_markdown(res: dict) -> str:
    s = res.get("settings", {})
    lines = [f"# turbo-llama eval — {Path(res.get('model', {}).get('path', '?')).name}", "",
             f"status: **{res.get('status')}** · backend {s.get('backend')} · ctx {s.get('ctx')} · "
             f"{s.get('chunks')} chunks of {Path(str(s.get('text'))).name} · threads {s.get('threads')}"
             f" · started {res.get('started')}", ""]
    base = (res.get("ppl") or {}).get("f16", {}).get("ppl")
    lines += ["| type | bits/value | KV MiB | KV bytes/token/layer | PPL ± err | PPL / f16 | mean KLD | "
              "KLD p99 | same top % | NIAH |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for t in res.get("types", []):
        r = (res.get("ppl") or {}).get(t, {})
        kv = r.get("kv") or {}
        nres = (res.get("niah_results") or {}).get(t) or {}
        niah = f"{sum(nres.values())}/{len(nres)}" if nres else "–"
        err = (res.get("errors") or {}).get(t)
        ppl = f"{r['ppl']:.4f} ± {r['ppl_err']:.4f}" if finite(r.get("ppl")) else ("error" if err else "–")
        ratio = r["ppl"] / base if finite(r.get("ppl")) and finite(base) else None
        if t == "f16":
            kld, p99, same = "0 (base)", "–", "100 (base)"
        else:
            kld = _fmt(r.get("kld_mean"), ".6f")
            p99 = _fmt(r.get("kld_p99"), ".5f")
            same = _fmt(r.get("same_top"), ".2f")
        lines.append(f"| {t} | {BITS_PER_VALUE.get(t, '?')} | {_fmt(kv.get('kv_mib'), '.2f')} | "
                     f"{_fmt(kv.get('bytes_per_token_per_layer'), '.0f')} | {ppl} | {_fmt(ratio, '.4f')} | "
                     f"{kld} | {p99} | {same} | {niah} |")
    f16n = (res.get("niah_results") or {}).get("f16") or {}
    if f16n and sum(f16n.values()) < 0.8 * len(f16n):
        lines += ["", f"**warning: the f16 baseline found only {sum(f16n.values())}/{len(f16n)} needles: "
                  "the NIAH task is too hard for this model, its scores say little about the cache types**"]
    errs = res.get("errors") or {}
    if errs:
        lines += ["", "## Errors", ""] + [f"- **{t}**: {m}" for t, m in errs.items()]
    n = res.get("niah") or {}
    if n.get("cells"):
        lines += ["", f"NIAH: lengths {n.get('lengths')} × depths {n.get('depths')}; needle "
                  f"\"{_niah.needle_sentence('<key>').strip()}\", greedy, {_niah.N_PREDICT} tokens; "
                  "score = exact key in the completion. Same prompts for every type."]
    lines += ["", "KV MiB: llama's own `llama_kv_cache: size` lines (iSWA: SWA + non-SWA caches summed) "
              "of the perplexity run at this context.", ""]
    k_paths = [(t, ((res.get("ppl") or {}).get(t, {}).get("kv") or {}).get("turbo_k")) for t in res.get("types", [])]
    k_paths = [(t, msgs) for t, msgs in k_paths if msgs]
    if k_paths:
        lines += ["How turbo K was stored (llama's log, `turbo K:` lines):", ""]
        lines += [f"- {t}: " + "; ".join(msgs) for t, msgs in k_paths] + [""]
    if res.get("timings"):
        lines += ["Timings (s): " + ", ".join(f"{k} {v:.0f}" for k, v in res["timings"].items()), ""]
    return "\n".join(lines)


def finish_outputs(res: dict, out: Path) -> None:
    _write_json(out / "results.json", res)
    (out / "results.md").write_text(render_markdown(res))
    try:
        plots.niah_png(res, out / "niah.png")
        plots.kld_png(res, out / "kld.png")
    except Exception as e:  # noqa: BLE001 - a plot must never lose the numbers
        click.echo(f"warning: plotting failed: {e}", err=True)


def run_eval(*, model_path: Path | None, types: list[str], ctx: int, chunks: int, text: Path | None,
             haystack: Path | None = None, niah_lengths: list[int], niah_depths: list[float], backend: str, threads: int,
             out: Path, quick: bool, repack: bool, skip_ppl: bool = False, skip_niah: bool = False,
             progress: bool = True) -> dict:
    from tqdm import tqdm

    out.mkdir(parents=True, exist_ok=True)
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    if "f16" not in types:
        types = ["f16", *types]  # the KLD base and the NIAH reference
    else:
        types = ["f16", *[t for t in types if t != "f16"]]
    mpath = Path(model_path) if model_path else _model.default_model()
    ppl_text = Path(text) if text else _model.jargon_text()
    hay_text = Path(haystack) if haystack else (None if skip_niah else _model.bible_text())
    tools = {"llama-perplexity": find_tool("llama-perplexity"), "llama-server": find_tool("llama-server")}
    bargs = backend_args(backend, threads, repack)

    res: dict = {
        "schema": 1, "status": "running", "started": _dt.datetime.now().isoformat(timespec="seconds"),
        "version": _version_info(tools), "machine": _machine(),
        "model": {"path": str(mpath), "sha256": _model.model_sha256(mpath)},
        "settings": {"types": types, "ctx": ctx, "chunks": chunks, "text": str(ppl_text),
                     "haystack": str(hay_text), "niah_lengths": niah_lengths, "niah_depths": niah_depths,
                     "backend": backend, "threads": threads, "quick": quick, "repack": repack},
        "bits_per_value": {t: BITS_PER_VALUE.get(t) for t in types},
        "types": types, "commands": [], "ppl": {}, "niah": {}, "niah_results": {}, "niah_raw": {},
        "errors": {}, "timings": {},
    }
    save = lambda: _write_json(out / "results.json", res)  # noqa: E731
    save()
    n_cells = len(niah_lengths) * len(niah_depths)
    total = (0 if skip_ppl else len(types)) + (0 if skip_niah else len(types) * n_cells)
    bar = tqdm(total=total, desc="eval", unit="step", disable=not progress, dynamic_ncols=True)
    t_start = time.monotonic()
    try:
        unsupported: set[str] = set()
        # ---------------------------------------------------------------- perplexity + KLD
        if not skip_ppl:
            work = Path(tempfile.mkdtemp(prefix="kld-", dir=out))
            base_file = work / "f16-logits.bin"
            try:
                cut = cut_text(ppl_text, work / "text.txt", ctx, chunks)
                res["settings"]["ppl_text_cut"] = {"chars": len(cut.read_text()),
                                                   "sha256": _model.sha256_file(cut)}
                need = kld_base_bytes(mpath, ctx, chunks)
                free = shutil.disk_usage(work).free
                if need and need * 1.1 > free:
                    raise ToolError(f"the f16 KLD base logits need ~{need / 2**30:.1f} GiB in {work.parent} "
                                    f"but only {free / 2**30:.1f} GiB are free: use fewer --chunks or "
                                    "another --out")
                for t in types:
                    bar.set_description(f"perplexity {t} (c={ctx}, {chunks} chunks)")
                    if t != "f16" and not base_file.exists():
                        res["errors"][t] = "skipped: no f16 base logits"
                        bar.update(1)
                        continue
                    cmd = ppl_command(tools["llama-perplexity"], mpath, cut, t, ctx, chunks, base_file,
                                      is_base=(t == "f16"), extra=bargs)
                    res["commands"].append({"step": f"ppl:{t}", "cmd": shlex.join(cmd)})
                    t0 = time.monotonic()
                    try:
                        r = run_ppl(cmd, logs / f"ppl-{t}.log", t)
                    except (ToolError, OSError) as e:
                        res["errors"][t] = f"perplexity: {e}"
                        if isinstance(e, UnsupportedCacheType):
                            unsupported.add(t)
                        bar.write(f"[{t}] perplexity: {e}")
                        r = None
                    dt = time.monotonic() - t0
                    res["timings"][f"ppl:{t}"] = dt
                    if r is not None:
                        r["bits_per_value"] = BITS_PER_VALUE.get(t)
                        r["seconds"] = dt
                        res["ppl"][t] = r
                        if t == "f16":
                            res["ppl"][t]["kld_base_bytes"] = base_file.stat().st_size
                    save()
                    bar.update(1)
            finally:
                for f in work.glob("*"):
                    f.unlink()
                work.rmdir()

        # ---------------------------------------------------------------- needle in a haystack
        if not skip_niah:
            hay = hay_text.read_text(errors="replace")
            n_ctx = max(niah_lengths) + _niah.N_PREDICT + 64
            cells: list[_niah.Cell] | None = None
            for t in types:
                if t in unsupported:  # already known: do not start a server just to hear it again
                    bar.update(n_cells)
                    continue
                bar.set_description(f"NIAH {t}: starting llama-server")
                args = ["-c", str(n_ctx), "-fa", "on", "-ctk", t, "-ctv", t, "-np", "1", "-lv", "4",
                        "--no-webui", "--swa-full", *bargs]
                # --swa-full: the SWA layers keep the whole context too (same attention mask, same
                # numbers), so a prompt can reuse the cached KV of the previous one up to its needle
                srv = LlamaServer(tools["llama-server"], mpath, args, log_path=logs / f"server-{t}.log")
                t0 = time.monotonic()
                try:
                    srv.start()
                except ToolError as e:
                    log = srv.log_text()
                    try:
                        check_unsupported(log, t)
                        msg = f"llama-server failed to start: {e}: " + " | ".join(log.strip().splitlines()[-3:])
                    except UnsupportedCacheType as u:
                        msg = str(u)
                    msg = f"NIAH: {msg}"
                    res["errors"][t] = (res["errors"][t] + "; " if t in res["errors"] else "") + msg
                    bar.write(f"[{t}] NIAH: {msg}")
                    res["commands"].append({"step": f"niah:{t}", "cmd": shlex.join(srv.cmd)})
                    bar.update(n_cells)
                    save()
                    continue
                try:
                    res["commands"].append({"step": f"niah:{t}", "cmd": shlex.join(srv.cmd)})
                    if cells is None:
                        bar.set_description("NIAH: building prompts")
                        cells = _niah.build_cells(hay, niah_lengths, niah_depths, srv.tokenize, srv.detokenize)
                        (out / "niah_prompts.json").write_text(json.dumps(
                            [c.to_json(with_prompt=True) for c in cells], indent=1))
                        res["niah"] = {"lengths": niah_lengths, "depths": niah_depths,
                                       "n_predict": _niah.N_PREDICT, "seed": _niah.SEED,
                                       "prompts": "niah_prompts.json",
                                       "run_order": _niah.run_order(cells),
                                       "cells": [c.to_json() for c in cells]}
                    kv = parse_kv_cache(srv.log_text())
                    res.setdefault("niah_kv", {})[t] = kv
                    res["niah_results"][t], res["niah_raw"][t] = {}, []
                    for c in (cells[i] for i in _niah.run_order(cells)):
                        bar.set_description(f"NIAH {t}: {c.length} tokens, depth {c.depth:g}")
                        t1 = time.monotonic()
                        r = srv.post("/completion", _niah.completion_request(c.prompt))
                        completion = r.get("content", "")
                        ok = _niah.found(c.key, completion)
                        res["niah_results"][t][f"{c.length}@{c.depth:g}"] = ok
                        res["niah_raw"][t].append({"length": c.length, "depth": c.depth, "key": c.key,
                                                   "completion": completion, "found": ok,
                                                   "n_prompt_tokens": r.get("tokens_evaluated"),
                                                   "seconds": time.monotonic() - t1})
                        save()
                        bar.update(1)
                finally:
                    srv.stop()
                    res["timings"][f"niah:{t}"] = time.monotonic() - t0
        res["status"] = "done"
    except KeyboardInterrupt:
        res["status"] = "interrupted"
        bar.write("interrupted: keeping what finished")
        raise
    except BaseException as e:
        res["status"] = "failed"
        res["errors"]["_fatal"] = repr(e)
        raise
    finally:
        bar.close()
        res["timings"]["total"] = time.monotonic() - t_start
        res["finished"] = _dt.datetime.now().isoformat(timespec="seconds")
        finish_outputs(res, out)
    return res


@click.command("eval")
@click.option("--model", "model_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="GGUF model (default: Gemma 3 270M Q4_K_M from the turbo-llama[model] package).")
@click.option("--types", default=",".join(DEFAULT_TYPES), show_default=True,
              help="KV-cache types, comma separated (f16 is always run first: KLD base).")
@click.option("--ctx", type=int, default=None, help=f"perplexity context [quick/default: {QUICK_CTX}]")
@click.option("--chunks", type=int, default=None,
              help=f"perplexity chunks [quick: {QUICK_CHUNKS}, full: {FULL_CHUNKS}]")
@click.option("--text", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="perplexity text (default: the Jargon File from Debian jargon-text)")
@click.option("--haystack", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="NIAH haystack text (default: the King James Bible from Debian bible-kjv)")
@click.option("--niah-lengths", default=None, help="comma separated token lengths "
              "[quick: 1024,2048,4096; full: 1K..model context]")
@click.option("--niah-depths", default=None, help="comma separated fractions [quick: 0.1,0.5,0.9; full: 10]")
@click.option("--backend", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--threads", type=int, default=os.cpu_count() or 1, show_default=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="output directory [results/eval-YYYYmmdd-HHMMSS]")
@click.option("--quick", is_flag=True, help="CI mode: small grid, a few chunks (< 15 min on 2 cores)")
@click.option("--repack/--no-repack", default=None,
              help="CPU weight repacking (default off on cpu: its AMX kernels SIGILL on some VMs)")
@click.option("--skip-ppl", is_flag=True, hidden=True)
@click.option("--skip-niah", is_flag=True, hidden=True)
def eval_command(model_path, types, ctx, chunks, text, haystack, niah_lengths, niah_depths, backend, threads,
                 out, quick, repack, skip_ppl, skip_niah):
    """Perplexity, KL divergence and needle-in-a-haystack for each KV-cache type."""
    type_list = _csv(types)
    for t in type_list:
        if t not in BITS_PER_VALUE:
            click.echo(f"warning: unknown bits/value for type {t!r}", err=True)
    ctx = ctx or QUICK_CTX
    chunks = chunks or (QUICK_CHUNKS if quick else FULL_CHUNKS)
    try:
        mpath = model_path or _model.default_model()
    except _model.AssetError as e:
        raise click.ClickException(str(e))
    if niah_lengths:
        lengths = _csv(niah_lengths, int)
    elif quick:
        lengths = list(_niah.QUICK_LENGTHS)
    else:
        n_train = _n_ctx_train(mpath)
        lengths = list(_niah.full_lengths(n_train))
    depths = _csv(niah_depths, float) if niah_depths else list(
        _niah.QUICK_DEPTHS if quick else _niah.FULL_DEPTHS)
    out = out or Path("results") / f"eval-{_dt.datetime.now():%Y%m%d-%H%M%S}"
    if repack is None:
        repack = backend != "cpu"
    click.echo(f"turbo-llama eval → {out}  (types {','.join(type_list)}, ctx {ctx}, {chunks} chunks, "
               f"NIAH {len(lengths)}×{len(depths)}, backend {backend}, {threads} threads)", err=True)
    try:
        res = run_eval(model_path=mpath, types=type_list, ctx=ctx, chunks=chunks, text=text,
                       haystack=haystack, niah_lengths=lengths, niah_depths=depths, backend=backend, threads=threads,
                       out=out, quick=quick, repack=repack, skip_ppl=skip_ppl, skip_niah=skip_niah)
    except KeyboardInterrupt:
        click.echo(f"\ninterrupted; partial results in {out}/results.json", err=True)
        sys.exit(130)
    except (_model.AssetError, ToolError) as e:
        raise click.ClickException(str(e))
    click.echo((out / "results.md").read_text())
    if res.get("errors"):
        click.echo("some types failed; see Errors above", err=True)


def _n_vocab(path: Path) -> int | None:
    try:
        import gguf
        r = gguf.GGUFReader(str(path))
        return len(r.fields["tokenizer.ggml.tokens"].data)
    except Exception:  # noqa: BLE001
        return None


def kld_base_bytes(path: Path, ctx: int, chunks: int) -> int | None:
    """Size of llama-perplexity's --kl-divergence-base file: per chunk, the second half of the
    context's tokens, each with n_vocab uint16 log-probs (+4 values of header per token)."""
    n_vocab = _n_vocab(path)
    if not n_vocab:
        return None
    return chunks * (ctx - 1 - ctx // 2) * (2 * ((n_vocab + 1) // 2) + 4) * 2 + ctx * chunks * 4 + 16


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
