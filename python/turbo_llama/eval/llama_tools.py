"""Running the built llama.cpp tools and reading what they print.

parse_*():    parsers of llama-perplexity / llama_kv_cache output (tested on captured real output).
LlamaServer:  llama-server on a free 127.0.0.1 port, in its own process group (processes.py), always
              shut down (try/finally, terminate, kill).
tool_reason(): the lines of a tool's log that say why it failed.
(The binaries themselves are found by build/installed.py's find_tool; a tool's failure is an errors.ToolError.)
"""
from __future__ import annotations

import json
import math
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ToolError
from . import processes


class UnsupportedCacheType(ToolError):
    """The built binary does not know this KV-cache type (e.g. a stock build asked for turbo3)."""


_UNSUPPORTED = re.compile(r"(Unsupported cache type|unknown cache type|invalid cache type|"
                          r"invalid parameter for argument: -ct[kv])[^\n]*", re.I)


def check_unsupported(output: str, cache_type: str) -> None:
    m = _UNSUPPORTED.search(output)
    if m:
        raise UnsupportedCacheType(f"this llama.cpp build does not support KV-cache type "
                                   f"{cache_type!r} ({m.group(0).strip()})")


_REASON = re.compile(r"error|fail|unable|invalid|unknown|unsupported|not found|no such|exception|what\(\)|abort|"
                     r"out of memory|cannot|can't|terminate", re.I)


def tool_reason(output: str, n: int = 4) -> str:
    """Why a llama.cpp tool failed, from its output: its last lines that name an error (else its last lines)."""
    lines = [l.strip() for l in output.splitlines() if l.strip()]
    hits = [l for l in lines if _REASON.search(l)]
    return " | ".join((hits or lines)[-n:]) or "(the tool printed nothing)"


def tool_version(exe: Path) -> str:
    try:
        r = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
        out = (r.stdout + r.stderr).strip().splitlines()
        return "; ".join(l for l in out if "version" in l or "built with" in l) or "\n".join(out[-2:])
    except (OSError, subprocess.SubprocessError) as e:
        return f"unknown ({e})"


# --------------------------------------------------------------------------------------- parsers
_NUM = r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))"
_KV_LINE = re.compile(
    r"llama_kv_cache\w*: size = \s*" + _NUM + r" MiB \(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+)/(\d+) seqs\),"
    r" K \((\w+)\):\s*" + _NUM + r" MiB, V \((\w+)\):\s*" + _NUM + r" MiB")

_TURBO_K_LINE = re.compile(r"turbo K: ([^\n]*)")
# the KV-cache patch's recent window, printed by a cache's constructor before its size line
_WINDOW_LINE = re.compile(r"turbo window: the last (\d+) cells of each stream also kept as K (\w+), V (\w+) rows")


def parse_kv_cache(output: str) -> dict | None:
    """Sum the llama_kv_cache size lines (Gemma 3 has two: the iSWA cache's SWA and non-SWA parts).

    Returns total MiB (as allocated for this context), K/V MiB, per-cache details, bytes per
    token per layer and bytes per token over all layers.
    """
    caches, start = [], 0
    for m in _KV_LINE.finditer(output):
        w = list(_WINDOW_LINE.finditer(output, start, m.start()))   # this cache's window, if it has one
        start = m.end()
        caches.append(dict(mib=float(m.group(1)), cells=int(m.group(2)), layers=int(m.group(3)),
                           n_seq=int(m.group(4)), n_stream=int(m.group(5)),
                           type_k=m.group(6), k_mib=float(m.group(7)), type_v=m.group(8),
                           v_mib=float(m.group(9)),
                           window=dict(rows=int(w[-1].group(1)), type_k=w[-1].group(2), type_v=w[-1].group(3))
                           if w else None))
    if not caches:
        return None
    # the context patch logs how a turbo K is stored ("turbo K: q/k norm gains rescaled ...")
    turbo_k = list(dict.fromkeys(m.strip() for m in _TURBO_K_LINE.findall(output)))
    total = sum(c["mib"] for c in caches)
    # each cache holds cells x streams tokens for each of its layers
    slots = sum(c["cells"] * c["n_stream"] * c["layers"] for c in caches)
    per_layer = total * 2**20 / slots if slots else None
    n_layers = sum(c["layers"] for c in caches)
    return dict(kv_mib=total, k_mib=sum(c["k_mib"] for c in caches),
                v_mib=sum(c["v_mib"] for c in caches), caches=caches, n_layers=n_layers, turbo_k=turbo_k,
                bytes_per_token_per_layer=per_layer,
                # what one more token of context costs if every layer kept it (full attention)
                bytes_per_token=per_layer * n_layers if per_layer else None)


def _f(s: str) -> float:
    return float(s)


_PATTERNS = {
    # base run (no --kl-divergence): "Final estimate: PPL = 23.4567 +/- 0.12345"
    "final": re.compile(r"Final estimate: PPL = " + _NUM + r" \+/- " + _NUM),
    "ppl_q": re.compile(r"Mean PPL\(Q\)\s*:\s*" + _NUM + r"\s*±\s*" + _NUM),
    "ppl_base": re.compile(r"Mean PPL\(base\)\s*:\s*" + _NUM + r"\s*±\s*" + _NUM),
    "ppl_ratio": re.compile(r"Mean PPL\(Q\)/PPL\(base\)\s*:\s*" + _NUM + r"\s*±\s*" + _NUM),
    "ln_ratio": re.compile(r"Mean ln\(PPL\(Q\)/PPL\(base\)\)\s*:\s*" + _NUM + r"\s*±\s*" + _NUM),
    "kld_mean": re.compile(r"Mean\s+KLD:\s*" + _NUM + r"\s*±\s*" + _NUM),
    "kld_max": re.compile(r"Maximum KLD:\s*" + _NUM),
    "kld_p999": re.compile(r"99\.9%\s+KLD:\s*" + _NUM),
    "kld_p99": re.compile(r"99\.0%\s+KLD:\s*" + _NUM),
    "kld_p95": re.compile(r"95\.0%\s+KLD:\s*" + _NUM),
    "kld_median": re.compile(r"Median\s+KLD:\s*" + _NUM),
    "same_top": re.compile(r"Same top p:\s*" + _NUM + r"\s*±\s*" + _NUM + r"\s*%"),
    "dp_rms": re.compile(r"RMS Δp\s*:\s*" + _NUM + r"\s*±\s*" + _NUM + r"\s*%"),
}


def parse_perplexity(output: str) -> dict:
    """Numbers from one llama-perplexity run (base run or --kl-divergence run)."""
    r: dict = {}
    m = _PATTERNS["final"].search(output)
    if m:
        r["ppl"], r["ppl_err"] = _f(m.group(1)), _f(m.group(2))
    m = _PATTERNS["ppl_q"].search(output)
    if m:  # KLD run: no "Final estimate" line, PPL(Q) is this run's perplexity
        r["ppl"], r["ppl_err"] = _f(m.group(1)), _f(m.group(2))
    for key in ("ppl_base", "ppl_ratio", "ln_ratio", "kld_mean", "same_top", "dp_rms"):
        m = _PATTERNS[key].search(output)
        if m:
            r[key], r[key + "_err"] = _f(m.group(1)), _f(m.group(2))
    for key in ("kld_max", "kld_p999", "kld_p99", "kld_p95", "kld_median"):
        m = _PATTERNS[key].search(output)
        if m:
            r[key] = _f(m.group(1))
    kv = parse_kv_cache(output)
    if kv:
        r["kv"] = kv
    return r


# --------------------------------------------------------------------------------------- server
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(p: subprocess.Popen, timeout: float = 15) -> None:
    """Terminate a child process, killing it if it does not exit within timeout seconds."""
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=timeout)


@dataclass
class LlamaServer:
    """`with LlamaServer(exe, model, args) as srv: srv.post("/completion", {...})`."""
    exe: Path
    model: Path
    args: list[str]
    log_path: Path | None = None
    startup_timeout: float = 300.0
    port: int = 0
    proc: subprocess.Popen | None = field(default=None, repr=False)
    cmd: list[str] = field(default_factory=list)

    def __enter__(self) -> "LlamaServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.port = self.port or free_port()
        self.cmd = [str(self.exe), "-m", str(self.model), "--host", "127.0.0.1",
                    "--port", str(self.port), *self.args]
        self._log = open(self.log_path, "w") if self.log_path else subprocess.DEVNULL
        self.proc = processes.popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + self.startup_timeout
            while True:
                if self.proc.poll() is not None:
                    raise ToolError(f"llama-server exited with {self.proc.returncode} during start: "
                                    f"{tool_reason(self.log_text())}")
                try:
                    with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                        if resp.status == 200 and json.loads(resp.read()).get("status") == "ok":
                            return
                except (urllib.error.URLError, OSError, ValueError):
                    pass
                if time.monotonic() > deadline:
                    raise ToolError(f"llama-server not healthy after {self.startup_timeout:.0f} s")
                time.sleep(0.25)
        except BaseException:
            self.stop()
            raise

    def log_text(self) -> str:
        if self.log_path and Path(self.log_path).exists():
            return Path(self.log_path).read_text(errors="replace")
        return ""

    def stop(self) -> None:
        p, self.proc = self.proc, None
        if p is not None:
            processes.stop(p)
        if self._log not in (None, subprocess.DEVNULL):
            self._log.close()
            self._log = None

    _log = None

    def post(self, path: str, payload: dict, timeout: float = 600.0) -> dict:
        req = urllib.request.Request(self.url + path, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())

    def tokenize(self, text: str) -> list[int]:
        return self.post("/tokenize", {"content": text, "add_special": False})["tokens"]

    def detokenize(self, tokens: list[int]) -> str:
        return self.post("/detokenize", {"tokens": tokens})["content"]


def finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
