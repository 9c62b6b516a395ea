"""KV-cache types and K/V pairs: names, bits per value, and which ones the built llama.cpp supports.

A cache is written `TYPE` (the same type for K and V) or `K/V` (e.g. `q8_0/turbo3`: q8_0 keys, turbo3
values). Its bits per value are the mean of K's and V's (K and V hold the same number of values).
What the build supports is asked from the built tool itself (`llama-perplexity --help` lists the
allowed values of -ctk), so a type added by a patch is known the moment it is built.
"""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .build.installed import find_tool

# bits per stored value of each ggml KV-cache type (block scales included)
BITS_PER_VALUE = {"f32": 32.0, "f16": 16.0, "bf16": 16.0, "q8_0": 8.5, "q5_1": 6.0, "q5_0": 5.5,
                  "q4_1": 5.0, "q4_0": 4.5, "iq4_nl": 4.5, "turbo4": 4.125, "turbo3": 3.125, "turbo2": 2.125}

# the quality ladder of `turbo-llama eval` (#28): every symmetric type, then the pairs users try
LADDER = ("f16", "q8_0", "q4_0", "turbo4", "turbo3", "turbo2",
          "turbo4/turbo3", "turbo4/turbo2", "q8_0/turbo3", "q8_0/turbo2")
BENCH_TYPES = ("f16", "q8_0", "q4_0", "turbo3", "turbo2")


class CacheTypeError(ValueError):
    """A cache type that is malformed or that the built tools do not support (message says which exist)."""


@dataclass(frozen=True)
class Cache:
    k: str
    v: str

    @property
    def name(self) -> str:
        return self.k if self.k == self.v else f"{self.k}/{self.v}"

    @property
    def bits_per_value(self) -> float | None:
        bk, bv = BITS_PER_VALUE.get(self.k), BITS_PER_VALUE.get(self.v)
        return (bk + bv) / 2 if bk is not None and bv is not None else None

    def args(self) -> list[str]:
        return ["-ctk", self.k, "-ctv", self.v]


_NAME = re.compile(r"[a-z][a-z0-9_]*$")


def parse_cache(spec: str) -> Cache:
    """'turbo3' -> Cache(turbo3, turbo3); 'q8_0/turbo3' -> Cache(q8_0, turbo3)."""
    parts = spec.strip().lower().split("/")
    if len(parts) not in (1, 2) or not all(_NAME.match(p) for p in parts):
        raise CacheTypeError(f"cache type {spec!r}: expected TYPE or K/V (e.g. turbo3 or q8_0/turbo3)")
    return Cache(parts[0], parts[-1])


def bits_per_value(name: str) -> float | None:
    try:
        return parse_cache(name).bits_per_value
    except CacheTypeError:
        return None


# the list wraps over lines and ends at "(default: ...)"
_ALLOWED = re.compile(r"--cache-type-k TYPE\b.*?allowed values:\s*(.*?)\(default", re.S)


def parse_allowed_types(help_text: str) -> list[str]:
    """The -ctk allowed values from a llama.cpp tool's --help text."""
    m = _ALLOWED.search(help_text)
    if not m:
        raise CacheTypeError("the tool's --help lists no allowed values for --cache-type-k")
    return [t.strip() for t in m.group(1).replace("\n", " ").split(",") if t.strip()]


def supported_types(exe: Path) -> list[str]:
    """The KV-cache types the built tool accepts (asked from the tool: `exe --help`)."""
    try:
        r = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL, errors="replace")
    except (OSError, subprocess.SubprocessError) as e:
        raise CacheTypeError(f"cannot ask {exe} for its cache types: {e}") from e
    try:
        return parse_allowed_types(r.stdout + r.stderr)
    except CacheTypeError:
        if r.returncode == 0:
            raise
        # the tool did not run (e.g. a shared library not found): its own words, not "lists no allowed values"
        said = " | ".join(ln.strip() for ln in r.stderr.strip().splitlines()[-3:]) or "no output"
        raise CacheTypeError(f"`{exe} --help` failed (exit {r.returncode}): {said}") from None


def check_caches(specs: list[str], supported: list[str]) -> list[Cache]:
    """Parse every spec and refuse, before any work, those whose K or V type the build lacks."""
    caches = [parse_cache(s) for s in specs]
    bad = sorted({t for c in caches for t in (c.k, c.v) if t not in supported})
    if bad:
        raise CacheTypeError(f"this llama.cpp build does not support the cache type(s) {', '.join(bad)}; "
                             f"it supports: {', '.join(supported)}")
    unknown_bits = sorted({t for c in caches for t in (c.k, c.v) if t not in BITS_PER_VALUE})
    if unknown_bits:
        raise CacheTypeError(f"no bits/value known for {', '.join(unknown_bits)} (add it to "
                             "turbo_llama.cache_types.BITS_PER_VALUE)")
    names = [c.name for c in caches]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise CacheTypeError(f"cache type(s) given twice: {', '.join(dup)}")
    return caches


def default_ladder(supported: list[str]) -> tuple[list[str], list[str]]:
    """The ladder's entries this build can run, and those it cannot (e.g. turbo4 on an older tree)."""
    ok, skipped = [], []
    for name in LADDER:
        c = parse_cache(name)
        (ok if c.k in supported and c.v in supported else skipped).append(name)
    return ok, skipped


def qwen_check_types(exe: Path | None = None) -> str:
    """CI's short Qwen check (#28): f16, turbo3, and turbo4 where the build has it."""
    supported = supported_types(exe or find_tool("llama-perplexity"))
    return ",".join(t for t in ("f16", "turbo3", "turbo4") if t in supported)
