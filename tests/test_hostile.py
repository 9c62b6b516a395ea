"""Hostile input to the quantizer: random bytes, NaN/Inf/huge floats, under sanitizers."""
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import turbo_llama as tl
from _kv_helpers import cpu_has_avx2_fma, run_simd_program_both_paths

ROOT = Path(__file__).resolve().parents[1]


@settings(max_examples=300, deadline=None)
@given(t=st.sampled_from(["turbo3", "turbo2"]), nblocks=st.integers(1, 6), data=st.data())
def test_dequantize_random_bytes_never_crashes(t, nblocks, data):
    size = tl.TYPES[t]["type_size"] * nblocks
    raw = data.draw(st.binary(min_size=size, max_size=size))
    q = np.frombuffer(raw, np.uint8).copy()
    # the documented rule (ggml's validate_row_data): a norm that is NaN, Inf or has its sign bit set is invalid
    norms = np.frombuffer(raw, np.uint8).reshape(nblocks, -1)[:, :2].copy().view(np.float16).ravel()
    valid = np.isfinite(norms) & ~np.signbit(norms)
    y = tl.dequantize(q, t, invalid="zero")
    assert y.shape == (nblocks * 128,)
    blocks = y.reshape(nblocks, 128)
    assert np.all(np.isfinite(blocks))                  # random bytes never give NaN or Inf
    assert np.all(blocks[~valid] == 0)                  # invalid blocks decode as zeros, as documented
    if valid.all():
        assert np.array_equal(tl.dequantize(q, t), y)   # the default decodes valid bytes the same way
    else:
        with pytest.raises(ValueError):                 # ... and refuses invalid ones, never silently
            tl.dequantize(q, t)


@settings(max_examples=200, deadline=None)
@given(t=st.sampled_from(["turbo3", "turbo2"]),
       values=st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=128, max_size=128))
def test_quantize_any_floats_gives_finite_decodes(t, values):
    x = np.array(values, np.float32)
    y = tl.dequantize(tl.quantize(x, t), t)
    assert np.all(np.isfinite(y))
    if not np.all(np.isfinite(x)):
        assert np.all(y == 0)


def test_c_reference_under_address_sanitizer(tmp_path):
    cc = shutil.which("gcc") or shutil.which("cc")
    assert cc, "a C compiler is needed (the package build needs one too)"
    exe = tmp_path / "sanitize_turbo"
    subprocess.run([cc, "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                    "-fno-omit-frame-pointer", f"-I{ROOT / 'cpu_ref'}", str(ROOT / "tests/c/sanitize_turbo.c"),
                    str(ROOT / "cpu_ref/ggml-turbo.c"), "-lm", "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "sanitize_turbo: ok" in out.stdout


def test_simd_attention_helpers_match_plain_c(tmp_path):
    """ggml-turbo.c is built into ggml-base without -march flags, so its AVX2+FMA attention helpers are
    compiled with a target attribute and picked at run time. Built the same plain way here: the SIMD run must
    use them on this CPU, give the plain C path's bits for the V accumulation and its K dots up to the
    summation order."""
    plain, simd = run_simd_program_both_paths("simd_turbo.c", tmp_path)
    assert plain["simd"] == "0"
    assert plain["gqa"] == "1", plain   # the GQA helpers equal the single-head calls bit for bit
    if not cpu_has_avx2_fma():
        pytest.skip("this CPU has no AVX2+FMA: only the plain path exists here")
    assert simd["simd"] == "1"
    assert simd["mad3"] == plain["mad3"] and simd["mad2"] == plain["mad2"]
    assert simd["gqa"] == "1", simd
    dots = [k for k in plain if k.startswith("dot")]
    assert len(dots) == 2 * 64 + 2
    for k in dots:
        a, b = float(plain[k]), float(simd[k])
        assert abs(a - b) <= 1e-4 * (1.0 + abs(a)), (k, a, b)
