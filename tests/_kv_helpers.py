"""Helpers for tests/test_kv_features.py: llama-server / llama-completion runs on the real model
with a chosen KV-cache pair, greedy and cheap (2 threads, small contexts)."""
from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from turbo_llama.llama_tools import LlamaServer, free_port, stop_process

THREADS = 2
SEED = 1234

# $TURBO_LLAMA_NGL (tests/conftest.py): unset/0 = CPU, the arguments below exactly as always;
# N > 0 = GPU run (ci/gpu-kv.sh): every tool also gets -ngl N (the thread arguments stay: harmless)
NGL = int(os.environ.get("TURBO_LLAMA_NGL") or 0)
GPU = NGL > 0
OFFLOAD = ["-ngl", str(NGL)] if GPU else []


def kv_args(ctk: str, ctv: str, ctx: int = 2048) -> list[str]:
    return ["-ctk", ctk, "-ctv", ctv, "-fa", "on", "-c", str(ctx), "-t", str(THREADS),
            "-tb", str(THREADS), "--seed", str(SEED), *OFFLOAD]


@contextmanager
def server(exe: Path, model: Path, log: Path, ctk: str, ctv: str, ctx: int = 2048, extra=()):
    """llama-server on a free 127.0.0.1 port; shut down in all cases. The log is kept at `log`."""
    srv = LlamaServer(exe, model, [*kv_args(ctk, ctv, ctx), *extra], log_path=log, startup_timeout=180)
    try:
        srv.start()
    except Exception as e:  # noqa: BLE001 - show what the server said
        raise AssertionError(f"llama-server did not start ({e}):\n{tail(log)}") from e
    try:
        yield srv
    finally:
        srv.stop()


class ServerDied(AssertionError):
    """llama-server exited (crashed) while a request was in flight."""


def tail(path: Path, n: int = 4000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-n:]
    except OSError:
        return ""


def request(srv: LlamaServer, path: str, payload: dict, timeout: float = 300) -> tuple[int, dict]:
    """POST; returns (HTTP status, JSON body) also for error statuses (the message a user sees)."""
    req = urllib.request.Request(srv.url + path, data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body)
        except ValueError:
            return e.code, {"raw": body.decode(errors="replace")}
    except (ConnectionError, http.client.HTTPException, urllib.error.URLError) as e:
        try:
            rc = srv.proc.wait(timeout=10) if srv.proc is not None else None
        except subprocess.TimeoutExpired:
            rc = None  # still running: not a crash
        if rc is not None:
            how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
            raise ServerDied(f"llama-server died ({how}) during POST {path}: {e!r}\n"
                             f"{tail(srv.log_path) if srv.log_path else ''}") from e
        raise


def greedy(prompt, n_predict: int = 16, **kw) -> dict:
    """A /completion request: greedy, fixed seed, token ids back (prompt may be text or token ids)."""
    return {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1, "top_p": 1.0,
            "min_p": 0.0, "seed": SEED, "samplers": ["top_k"], "return_tokens": True,
            "cache_prompt": True, "stream": False, **kw}


def complete(srv: LlamaServer, prompt, n_predict: int = 16, **kw) -> dict:
    code, body = request(srv, "/completion", greedy(prompt, n_predict, **kw))
    assert code == 200, f"/completion failed ({code}): {body}"
    return body


def concurrently(fns):
    """Run the callables at the same time (threads); results in order."""
    with ThreadPoolExecutor(len(fns)) as ex:
        futs = [ex.submit(f) for f in fns]
        return [f.result() for f in futs]


def first_divergence(a: list, b: list) -> int:
    """Index of the first differing token (len when one is a prefix of the other and equal length)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


_WORD = re.compile(r"^[\"'(\[]*[A-Za-z][A-Za-z'’-]*[.,;:!?)\]\"']*$")


def readability(text: str) -> dict:
    """How much of the text is plain words, and the longest run of non-letter, non-space characters
    (garbage from a broken cache shows as symbol/digit runs, foreign scripts or broken tokens)."""
    words = text.split()
    alpha = sum(1 for w in words if _WORD.match(w))
    runs = re.findall(r"[^A-Za-z\s]+", text)
    distinct = len({w.lower().strip(".,;:!?\"'") for w in words})
    return {"n_words": len(words), "alpha_frac": alpha / max(1, len(words)),
            "longest_junk": max((len(r) for r in runs), default=0), "distinct_words": distinct}


def run(cmd: list, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@contextmanager
def rpc_server(exe: Path, log: Path, threads: int = THREADS):
    """ggml-rpc-server on 127.0.0.1:PORT (no local file cache); stopped in all cases."""
    port = free_port()
    with open(log, "w") as f:
        p = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port), "-t", str(threads)],
                             stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while True:
                if p.poll() is not None:
                    raise AssertionError(f"ggml-rpc-server exited with {p.returncode}:\n{tail(log)}")
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise AssertionError(f"ggml-rpc-server not listening after 60 s:\n{tail(log)}")
                    time.sleep(0.2)
            yield f"127.0.0.1:{port}"
        finally:
            stop_process(p)


def recorded_cpu_build(llama_tool) -> tuple[Path, Path]:
    """(build dir, source tree) of the recorded CPU build, whose static libraries the tests link against (skips when
    the recorded build is a CUDA one)."""
    from turbo_llama.build import installed_info
    llama_tool("llama-completion")  # skips/fails with the build hint when nothing is built
    info = installed_info()
    assert info and Path(info["build_dir"]).is_dir(), "turbo-llama build left no build record"
    if info.get("cuda"):
        # a CUDA build's static libraries need the CUDA runtime to link; these programs measure the CPU path
        pytest.skip("needs the CPU build's static libraries, and the recorded build is a CUDA one "
                    "(`turbo-llama build` without --cuda records a CPU build)")
    return Path(info["build_dir"]), Path(info["build_src"])


def link_llama_program(src: Path, exe: Path, llama_tool) -> Path:
    """A small C++ program on the public llama.h API (tests/c/), linked against the static libraries of the recorded
    CPU build: the llama.cpp that is in the tools (skips when that build is a CUDA one)."""
    build, root = recorded_cpu_build(llama_tool)
    libs = [build / "src" / "libllama.a", *sorted((build / "ggml").rglob("libggml*.a"))]
    assert libs[0].is_file() and len(libs) >= 4, f"static libraries not found under {build}: {libs}"
    subprocess.run(["g++", "-O2", "-std=c++17", str(src), f"-I{root / 'include'}", f"-I{root / 'ggml/include'}",
                    "-Wl,--start-group", *map(str, libs), "-Wl,--end-group", "-fopenmp", "-lpthread", "-lm",
                    "-o", str(exe)], check=True)
    return exe
