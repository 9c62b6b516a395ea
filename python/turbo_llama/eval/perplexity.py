"""The eval's perplexity step: PPL and KL divergence of each KV cache against an f16-cache run.

llama-perplexity runs once with an f16 cache (writing the base logits: --kl-divergence-base), then once
per cache type or K/V pair with --kl-divergence against those logits. The base logits (~0.5 GiB per
chunk for Gemma 3's 262k vocabulary at c=2048) live in a work folder that is deleted afterwards.
"""
from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

from ..cache_types import Cache, parse_cache
from ..errors import ToolError
from . import processes
from .llama_tools import UnsupportedCacheType, check_unsupported, parse_perplexity, tool_reason
from .progress import WorkBar


def backend_args(backend: str, threads: int, repack: bool) -> list[str]:
    args = ["-ngl", "99" if backend == "cuda" else "0", "-t", str(threads), "-tb", str(threads)]
    if not repack:
        args.append("-nr")  # CPU weight repacking off (its AMX path dies with SIGILL on some VMs)
    return args


def cut_text(src: Path, dst: Path, ctx: int, chunks: int) -> Path:
    """Only the start of the text that ctx*chunks tokens need (llama-perplexity tokenises all of
    its input first, ~30 s for the whole Jargon File on 2 cores). ~4 characters a token; 3x margin."""
    text = Path(src).read_text(errors="replace")
    n = ctx * chunks * 12 if chunks > 0 else len(text)
    dst.write_text(text[:n])
    return dst


def ppl_command(exe: Path, model: Path, text: Path, cache: str | Cache, ctx: int, chunks: int,
                base_file: Path, is_base: bool, extra: list[str]) -> list[str]:
    c = cache if isinstance(cache, Cache) else parse_cache(cache)
    cmd = [str(exe), "-m", str(model), "-f", str(text), "-c", str(ctx), "--chunks", str(chunks),
           "-fa", "on", *c.args(), "-lv", "4", *extra, "--kl-divergence-base", str(base_file)]
    if not is_base:
        cmd.append("--kl-divergence")
    return cmd


def run_ppl(cmd: list[str], log_path: Path, cache_type: str, timeout: float | None = None) -> dict:
    """Run one llama-perplexity command (in its own process group, stopped on any way out); returns its
    parsed numbers, raises ToolError with the tool's reason on failure."""
    with open(log_path, "w") as log:
        rc = processes.run(cmd, timeout=timeout, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    out = log_path.read_text(errors="replace")
    check_unsupported(out, cache_type)
    res = parse_perplexity(out)
    if rc != 0 or "ppl" not in res:
        raise ToolError(f"llama-perplexity ({cache_type}) failed with exit code {rc}: {tool_reason(out)}")
    return res


def measured_bits(r: dict, base: dict | None, nominal: float | None = None) -> float | None:
    """Bits per value as stored: 16 x this cache's KV bytes / the f16 cache's, from llama's own size lines of the
    two runs (same context); None without them (and for the f16 run itself, which has no base yet). It differs
    from the types' nominal bits where layers keep another type (a turbo K cache keeps the sliding-window layers'
    keys in q8_0); within the lines' rounding (MiB to 2 decimals, 0.2%) of the nominal bits it is the nominal
    figure."""
    mib, base_mib = (r.get("kv") or {}).get("kv_mib"), ((base or {}).get("kv") or {}).get("kv_mib")
    if not (mib and base_mib):
        return None
    bits = 16.0 * mib / base_mib
    return nominal if nominal and abs(bits - nominal) <= 0.002 * nominal else bits


def log_name(cache_name: str) -> str:
    return cache_name.replace("/", "-")


def kld_base_bytes(path: Path, ctx: int, chunks: int) -> int | None:
    """Size of llama-perplexity's --kl-divergence-base file: per chunk, the second half of the
    context's tokens, each with n_vocab uint16 log-probs (+4 values of header per token)."""
    n_vocab = _n_vocab(path)
    if not n_vocab:
        return None
    return chunks * (ctx - 1 - ctx // 2) * (2 * ((n_vocab + 1) // 2) + 4) * 2 + ctx * chunks * 4 + 16


def _n_vocab(path: Path) -> int | None:
    try:
        import gguf
        r = gguf.GGUFReader(str(path))
        return len(r.fields["tokenizer.ggml.tokens"].data)
    except Exception:  # noqa: BLE001 - a model gguf-py cannot read: no disk check, the tool will say more
        return None


def perplexity_step(res: dict, *, exe: Path, model: Path, text: Path, ctx: int, chunks: int, extra: list[str],
                    out: Path, logs: Path, save: Callable[[], None], bar: WorkBar,
                    units: float, sha256_file: Callable[[Path], str], text_name: str | None = None) -> None:
    """Run the f16 base and every other cache of res["types"] on one text; fills res["ppl_by_text"][text_name],
    res["errors"], res["commands"], res["timings"]. The first text measured is the primary one: its figures are
    also res["ppl"] (what the guard and the plots read) and its keys carry no text suffix; a later text's
    errors, commands, timings and logs are named `<cache>@<text>`. The f16 base failing is fatal (ToolError):
    nothing can be compared."""
    text_name = text_name or Path(text).stem
    by_text = res.setdefault("ppl_by_text", {})
    primary = not by_text or text_name == next(iter(by_text))
    ppl = by_text.setdefault(text_name, {})
    if primary:
        res["ppl"] = ppl
    tag = "" if primary else f"@{text_name}"
    work = Path(tempfile.mkdtemp(prefix="kld-", dir=out))
    base_file = work / "f16-logits.bin"
    try:
        cut = cut_text(text, work / "text.txt", ctx, chunks)
        cut_info = {"chars": len(cut.read_text()), "sha256": sha256_file(cut)}
        if primary:
            res["settings"]["ppl_text_cut"] = cut_info
        res["settings"].setdefault("ppl_text_cuts", {})[text_name] = cut_info
        need = kld_base_bytes(model, ctx, chunks)
        free = shutil.disk_usage(work).free
        if need and need * 1.1 > free:
            raise ToolError(f"the f16 KLD base logits need ~{need / 2**30:.1f} GiB in {out} "
                            f"but only {free / 2**30:.1f} GiB are free: use fewer --chunks or another --out")
        for name in res["types"]:
            label = name + tag
            bar.describe(f"perplexity {name} (c={ctx}, {chunks} chunks{', ' + text_name if tag else ''})")
            is_base = name == "f16"
            cmd = ppl_command(exe, model, cut, name, ctx, chunks, base_file, is_base=is_base, extra=extra)
            res["commands"].append({"step": f"ppl:{label}", "cmd": shlex.join(cmd)})
            t0 = time.monotonic()
            try:
                r = run_ppl(cmd, logs / f"ppl-{log_name(label)}.log", name)
            except (ToolError, OSError) as e:
                if is_base:
                    raise ToolError(f"the f16 base run failed{' on ' + text_name if tag else ''}, nothing to "
                                    f"compare with: {e}") from e
                res["errors"][label] = f"perplexity: {e}"
                bar.write(f"[{label}] perplexity: {e}")
                if isinstance(e, UnsupportedCacheType) and name not in res.get("unsupported", []):
                    res.setdefault("unsupported", []).append(name)
                r = None
            dt = time.monotonic() - t0
            res["timings"][f"ppl:{label}"] = dt
            if r is not None:
                nominal = res["bits_per_value"].get(name)
                r.update(bits_per_value=measured_bits(r, ppl.get("f16"), nominal) or nominal,
                         type_bits_per_value=nominal, seconds=dt, units=units)
                ppl[name] = r
                if is_base:
                    r["kld_base_bytes"] = base_file.stat().st_size
            save()
            bar.add(units)
    finally:
        shutil.rmtree(work, ignore_errors=True)
