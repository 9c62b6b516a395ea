"""Helpers for the tests of the built llama.cpp and of the C reference: llama-server / llama-completion runs on the
real model with a chosen KV-cache pair, greedy and cheap (2 threads, small contexts) (tests/test_kv_features.py);
the recorded build and small programs linked against it (tests/c/); the SIMD programs run on both paths."""
from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

import turbo_llama as tl
from turbo_llama.eval.llama_tools import LlamaServer, free_port, stop_process

ROOT = Path(__file__).resolve().parents[1]

THREADS = 2
SEED = 1234

def window_type(t: str) -> str:
    """the type of the recent window's rows of a cache side: q8_0 for a turbo side, the side's own otherwise"""
    return "q8_0" if t.startswith("turbo") else t


def default_window_rows(n_ctx_seq: int, cells: int, n_ubatch: int = 512) -> int:
    """The recent window's rows per stream of a cache of `cells` cells with TURBO_WINDOW unset (docs/window.md):
    64 + n_ubatch (at most 512), at most half of a sequence's context (in whole 32s) and at most the cells."""
    return min(64 + min(n_ubatch, 512), n_ctx_seq // 2 // 32 * 32, cells)

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


def recorded_build(llama_tool) -> dict:
    """The record of the installed build (build_dir, build_src, cuda, ...)."""
    from turbo_llama.build.installed import installed_info
    llama_tool("llama-completion")  # skips/fails with the build hint when nothing is built
    info = installed_info()
    assert info and Path(info["build_dir"]).is_dir(), "turbo-llama build left no build record"
    return info


@pytest.fixture(scope="module")
def build_info(llama_tool):
    return recorded_build(llama_tool)


@pytest.fixture(scope="module")
def llama_build_bin(build_info):
    return lambda name: Path(build_info["build_dir"]) / "bin" / name


def recorded_cpu_build(llama_tool) -> tuple[Path, Path]:
    """(build dir, source tree) of the recorded CPU build, whose static libraries the tests link against (skips when
    the recorded build is a CUDA one)."""
    info = recorded_build(llama_tool)
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


def link_against_ggml(build_info, src: str, out: Path) -> Path:
    """tests/c/<src>, a small C program, linked against the built libggml-base.a: the ggml that is in the tools."""
    build, tree = Path(build_info["build_dir"]), Path(build_info["build_src"])
    libs = sorted(build.rglob("libggml-base.a"))
    assert libs, f"libggml-base.a not found under {build}"
    subprocess.run(["g++", "-x", "c", str(ROOT / "tests/c" / src), "-x", "none", f"-I{tree / 'ggml/include'}",
                    str(libs[0]), "-fopenmp", "-lm", "-lpthread", "-o", str(out)], check=True)
    return out


@pytest.fixture(scope="module")
def ggml_roundtrip(build_info, tmp_path_factory):
    """tests/c/ggml_roundtrip.c linked against the built ggml."""
    return link_against_ggml(build_info, "ggml_roundtrip.c", tmp_path_factory.mktemp("ggml") / "ggml_roundtrip")


def rows_with_hostile_blocks(seed: int, ncols: int, qk: int) -> np.ndarray:
    """64 rows of ncols (at least 3 blocks of qk) of scaled normal values, with a zero block (row 3, block 0), a NaN
    block (row 5, block 1), a huge block (row 6, block 2) and a row of norms near FP16's subnormal range (row 7)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((64, ncols)).astype(np.float32) * rng.uniform(0.01, 50, (64, 1)).astype(np.float32)
    x[3, :qk] = 0.0
    x[5, qk + 72 * qk // 128] = np.nan
    huge = 2 * qk + 44 * qk // 128
    x[6, huge:huge + 10] = 1e30
    x[7] *= np.float32(1e-6)
    return x


def ggml_quantizes_as_the_bindings(exe: Path, t: str, x: np.ndarray, tmp_path: Path) -> tuple[str, np.ndarray]:
    """Runs ggml_roundtrip on x; asserts that ggml's bytes and decoded floats are the bindings' bit for bit; returns
    the program's output and the bytes."""
    nrows, ncols = x.shape
    x.tofile(tmp_path / "x.f32")
    out = subprocess.run([str(exe), t, str(nrows), str(ncols), str(tmp_path / "x.f32"), str(tmp_path / "q.bin"),
                          str(tmp_path / "y.f32")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    q = np.fromfile(tmp_path / "q.bin", np.uint8).reshape(nrows, -1)
    np.testing.assert_array_equal(q, tl.quantize(x, t))
    y = np.fromfile(tmp_path / "y.f32", np.float32).reshape(nrows, ncols)
    np.testing.assert_array_equal(y, tl.dequantize(q, t))
    return out.stdout, q


def cpu_has_avx2_fma() -> bool:
    try:
        flags = open("/proc/cpuinfo").read().split()
    except OSError:
        return False
    return "avx2" in flags and "fma" in flags


def run_simd_program_both_paths(src: str, tmp_path: Path) -> tuple[dict, dict]:
    """tests/c/<src> (which includes cpu_ref/ggml-turbo.c) built the plain way ggml-base builds it (no -march), run
    with TURBO_NO_SIMD=1 and =0: each run's "name value" lines as a dict, (plain, simd)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    assert cc, "a C compiler is needed (the package build needs one too)"
    exe = tmp_path / Path(src).stem
    subprocess.run([cc, "-O2", "-std=gnu11", f"-I{ROOT / 'cpu_ref'}", str(ROOT / "tests/c" / src), "-lm",
                    "-o", str(exe)], check=True)

    def run_with(no_simd: str) -> dict:
        out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "TURBO_NO_SIMD": no_simd})
        assert out.returncode == 0, out.stderr
        return dict(line.rsplit(" ", 1) for line in out.stdout.splitlines())

    return run_with("1"), run_with("0")
