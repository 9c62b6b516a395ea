"""The CUDA code's encode and RoPE math, compiled as host code with a warp emulated lane by lane (cuda/host-check/),
on this GPU-less machine: the 2-thread KV write must give the C reference's bytes, and the RoPE-on-load helpers
(llama's RoPE of K in the turbo K write, of Q in the decode attention kernel) must match ggml's CPU ROPE. The GPU
runs (test-backend-ops on the H200) check the same kernels on the device; these keep a change of the shared helpers
from reaching the device unchecked."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from _kv_helpers import recorded_cpu_build

HOST_CHECK = Path(__file__).resolve().parent.parent / "cuda" / "host-check"


def run_host_check(script: str, env: dict | None = None) -> str:
    """Runs one cuda/host-check script; it must exit 0 with PASS as its last line. Returns its output."""
    out = subprocess.run(["bash", str(HOST_CHECK / script)], capture_output=True, text=True, timeout=600, env=env)
    lines = out.stdout.strip().splitlines()
    assert out.returncode == 0 and lines and lines[-1] == "PASS", out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def test_cuda_rope_on_load_on_the_host(llama_tool):
    """The RoPE that the K write and the decode attention do on load (turbo-common.cuh) against ggml's CPU ROPE."""
    build, root = recorded_cpu_build(llama_tool)
    run_host_check("rope_check.sh", dict(os.environ, TURBO_LLAMA_SRC=str(root), TURBO_LLAMA_BUILD=str(build)))


def test_two_thread_kv_write_on_the_host():
    """The default write of large SET_ROWS (cuda/turbo-encode-t2.cuh: a block per pair of threads, the code search by
    integer compares): every block, special ones included (zeros, NaN, Inf, huge, signed zeros, the fused key offset,
    both store alignments), equals the C reference byte for byte, and so does the code of values at every boundary.
    Needs only g++ (the C reference is compiled in)."""
    assert "0 of 960 blocks differ" in run_host_check("set_rows_t2_check.sh")


def test_64_value_warp_helpers_on_the_host():
    """The 64-value types' warp helpers (cuda/turbo-common.cuh: encode and pack as SET_ROWS / CPY do, decode as GET_ROWS
    does, the rotations of cell 0's rows and of the attention), the 32 lanes emulated: every block of turbo4_64,
    turbo3_64 and turbo2_64 (special ones included: zeros, NaN, Inf, huge, tiny, constant, sparse) equals the C
    reference byte for byte, and every decoded or rotated value bit for bit. Needs only g++."""
    out = run_host_check("turbo64_check.sh")
    for bits in (4, 3, 2):
        assert f"turbo{bits}_64: 0 of 120 blocks differ" in out
