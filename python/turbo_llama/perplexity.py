"""Perplexity + KL divergence of each KV-cache type against an f16-cache run (llama-perplexity)."""
from __future__ import annotations

import subprocess
from pathlib import Path

from .llama_tools import UnsupportedCacheType, ToolError, check_unsupported, parse_perplexity


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


def ppl_command(exe: Path, model: Path, text: Path, cache_type: str, ctx: int, chunks: int,
                base_file: Path, is_base: bool, extra: list[str]) -> list[str]:
    cmd = [str(exe), "-m", str(model), "-f", str(text), "-c", str(ctx), "--chunks", str(chunks),
           "-fa", "on", "-ctk", cache_type, "-ctv", cache_type, "-lv", "4", *extra,
           "--kl-divergence-base", str(base_file)]
    if not is_base:
        cmd.append("--kl-divergence")
    return cmd


def run_ppl(cmd: list[str], log_path: Path, cache_type: str, timeout: float | None = None) -> dict:
    """Run one llama-perplexity command; returns its parsed numbers (raises on failure)."""
    with open(log_path, "w") as log:
        r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                           timeout=timeout)
    out = log_path.read_text(errors="replace")
    check_unsupported(out, cache_type)
    res = parse_perplexity(out)
    if r.returncode != 0 or "ppl" not in res:
        tail = "\n".join(out.strip().splitlines()[-5:])
        raise ToolError(f"llama-perplexity ({cache_type}) failed with exit code {r.returncode}:\n{tail}")
    return res


__all__ = ["backend_args", "cut_text", "ppl_command", "run_ppl", "UnsupportedCacheType"]
