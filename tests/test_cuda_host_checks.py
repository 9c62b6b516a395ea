"""The CUDA code's encode and RoPE math, compiled as host code with a warp emulated lane by lane (cuda/host-check/),
on this GPU-less machine: the 4-thread KV write must give the C reference's bytes, and the RoPE-on-load helpers
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


@pytest.mark.parametrize("script", ["set_rows_t4_check.sh", "rope_check.sh"])
def test_cuda_math_on_the_host(script, llama_tool):
    build, root = recorded_cpu_build(llama_tool)
    env = dict(os.environ, TURBO_LLAMA_SRC=str(root), TURBO_LLAMA_BUILD=str(build))
    out = subprocess.run(["bash", str(HOST_CHECK / script)], capture_output=True, text=True, timeout=600, env=env)
    lines = out.stdout.strip().splitlines()
    assert out.returncode == 0 and lines and lines[-1] == "PASS", out.stdout[-3000:] + out.stderr[-3000:]
