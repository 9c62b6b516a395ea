"""The 64-value block types (turbo4_64, turbo3_64, turbo2_64) for head_dim 64 models, through the bindings:
their d=64 codebooks, distortion against the Lloyd-Max figure, the 64-point rotation, block independence,
the zero/NaN rules of the 128-value types, and the bindings' contract."""
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import turbo_llama as tl
from test_codebooks import arrays   # the header parser of the 128-value codebooks

ROOT = Path(__file__).resolve().parents[1]
HEADER_64 = ROOT / "cpu_ref" / "turbo-codebooks-64.h"
HEADER_128 = ROOT / "cpu_ref" / "turbo-codebooks.h"
SCRIPT = ROOT / "cpu_ref" / "scripts" / "gen_codebooks.py"
TYPES_64 = ("turbo4_64", "turbo3_64", "turbo2_64")
BITS = {"turbo4_64": 4, "turbo3_64": 3, "turbo2_64": 2}


def mse_x_dim(text):
    return {f"turbo{b}_64": float(v) for b, v in re.findall(r"#define TURBO(\d)_64_MSE_X_DIM ([0-9.]+)", text)}


@pytest.fixture(scope="module")
def regenerated():
    return subprocess.run([sys.executable, str(SCRIPT), "--dim", "64"], check=True,
                          capture_output=True, text=True).stdout


def roundtrip(x, t):
    return tl.dequantize(tl.quantize(x, t), t)


def test_header_is_the_script_output(regenerated):
    checked_in = HEADER_64.read_text()
    assert arrays(checked_in).keys() == arrays(regenerated).keys() == {
        f"turbo{b}_64_{kind}" for b in (4, 3, 2) for kind in ("centroids", "boundaries")}
    for name, values in arrays(checked_in).items():
        assert values == pytest.approx(arrays(regenerated)[name], rel=1e-7, abs=1e-12), name
    assert mse_x_dim(checked_in) == mse_x_dim(regenerated)


def test_d64_codebooks_are_lloyd_max_optima_for_d64(regenerated):
    """The optimum for the coordinate law at d=64 is a little below d=128's (lighter tails), and its centroids
    are the d=128 ones scaled by about sqrt(2) (the coordinate's spread is 1/sqrt(d))."""
    mse = mse_x_dim(regenerated)
    assert mse["turbo3_64"] == pytest.approx(0.03339, abs=0.0001)
    assert mse["turbo2_64"] == pytest.approx(0.1145, abs=0.0002)
    assert mse["turbo4_64"] == pytest.approx(0.00913, abs=0.00005)
    c64, c128 = arrays(regenerated), arrays(HEADER_128.read_text())
    for bits in (4, 3, 2):
        cent, bound = c64[f"turbo{bits}_64_centroids"], c64[f"turbo{bits}_64_boundaries"]
        assert len(cent) == 2 ** bits and cent == sorted(cent)
        assert all(abs(x + y) < 1e-9 for x, y in zip(cent, reversed(cent)))
        for i, b in enumerate(bound):
            assert b == pytest.approx((cent[i] + cent[i + 1]) / 2, abs=1e-9)
        ratio = np.array(cent) / np.array(c128[f"turbo{bits}_centroids"])
        assert np.all((ratio > 1.35) & (ratio < 1.42)), ratio


@pytest.mark.parametrize("t", TYPES_64)
def test_distortion_of_random_unit_vectors_is_the_lloyd_max_figure(t):
    """On uniformly random unit vectors in 64 dimensions (the codebook's own input law) the distortion is the
    d=64 Lloyd-Max figure within 4% (the norm correction takes a little off, as for the 128-value types)."""
    x = np.random.default_rng(64).standard_normal((40000, 64))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    mse = float(np.mean(np.sum((x - roundtrip(x, t)) ** 2, axis=1)))
    want = mse_x_dim(HEADER_64.read_text())[t]
    assert abs(mse - want) < 0.04 * want, f"{t}: {mse:.5f} vs Lloyd-Max {want}"
    assert mse > 4.0 ** -BITS[t]   # no scalar quantizer at b bits beats 4^-b


@pytest.mark.parametrize("t", TYPES_64)
def test_d64_codebook_beats_the_d128_codebook_on_64_value_blocks(t):
    """The reason for a codebook of its own: the d=128 centroids scaled to d=64's spread (sqrt 2) are worse
    on 64-value blocks than the d=64 Lloyd-Max centroids."""
    c128 = np.array(arrays(HEADER_128.read_text())[t.replace("_64", "_centroids")]) * np.sqrt(2.0)
    c64 = np.array(arrays(HEADER_64.read_text())[t + "_centroids"])
    y = np.random.default_rng(7).standard_normal((20000, 64))
    y = y / np.linalg.norm(y, axis=1, keepdims=True)

    def mse(c):
        idx = np.argmin(np.abs(y[..., None] - c), axis=-1)
        return float(np.mean(np.sum((y - c[idx]) ** 2, axis=1)))
    assert mse(c64) < mse(c128)


def test_rotation_is_the_64_point_hadamard_with_the_first_64_signs():
    words = arrays(HEADER_128.read_text())["turbo_sign_words"]
    signs = np.array([-1.0 if (words[i // 32] >> (i % 32)) & 1 else 1.0 for i in range(64)])
    h = np.array([[1.0]])
    while h.shape[0] < 64:
        h = np.block([[h, h], [h, -h]])
    x = np.random.default_rng(3).standard_normal((50, 192)).astype(np.float32)
    want = np.concatenate([(x[:, 64 * j:64 * j + 64] * signs) @ h.T / 8.0 for j in range(3)], axis=1)
    got = tl.rotate(x, block=64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tl.unrotate(got, block=64), x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("t", TYPES_64)
def test_sizes_and_independent_blocks(t):
    """SmolLM2-135M's K row (3 heads of 64): 3 blocks of the type's bytes, each the quantization of its own head."""
    assert tl.TYPES[t]["block_size"] == 64 and tl.TYPES[t]["type_size"] == 2 + 64 * BITS[t] // 8
    x = np.random.default_rng(5).standard_normal((16, 192)).astype(np.float32)
    q = tl.quantize(x, t)
    bs = tl.TYPES[t]["type_size"]
    assert q.shape == (16, 3 * bs)
    for j in range(3):
        np.testing.assert_array_equal(q[:, j * bs:(j + 1) * bs], tl.quantize(np.ascontiguousarray(x[:, 64 * j:64 * j + 64]), t))
    # the decoded block keeps the input's norm (norm correction), to FP16 precision
    y = tl.dequantize(q, t).reshape(16, 3, 64)
    n_in, n_out = np.linalg.norm(x.reshape(16, 3, 64), axis=2), np.linalg.norm(y, axis=2)
    np.testing.assert_allclose(n_out, n_in, rtol=2e-3)


@pytest.mark.parametrize("t", TYPES_64)
def test_zero_nan_and_inf_blocks_decode_to_zeros(t):
    x = np.random.default_rng(9).standard_normal((4, 128)).astype(np.float32)
    x[0, :64] = 0.0
    x[1, 70] = np.nan
    x[2, 3] = np.inf
    y = roundtrip(x, t)
    assert np.all(y[0, :64] == 0) and np.all(y[1, 64:] == 0) and np.all(y[2, :64] == 0)
    assert np.all(np.isfinite(y))
    assert np.linalg.norm(y[3] - x[3]) < 0.5 * np.linalg.norm(x[3])   # the untouched row is a real encoding


@pytest.mark.parametrize("t", TYPES_64)
def test_bad_lengths_name_the_block_size(t):
    with pytest.raises(ValueError, match="multiple of 64"):
        tl.quantize(np.zeros((2, 96), np.float32), t)
    with pytest.raises(ValueError, match="block size"):
        tl.dequantize(np.zeros((2, tl.TYPES[t]["type_size"] + 1), np.uint8), t)
    with pytest.raises(ValueError, match="block must be 128 or 64"):
        tl.rotate(np.zeros((2, 96), np.float32), block=32)


def test_invalid_norm_is_named():
    q = tl.quantize(np.ones((1, 128), np.float32), "turbo3_64")
    q[0, 26 + 1] = 0x80   # block 1's norm: sign bit set
    with pytest.raises(ValueError, match="block 1"):
        tl.dequantize(q, "turbo3_64")
    y = tl.dequantize(q, "turbo3_64", invalid="zero")
    assert np.all(y[0, 64:] == 0) and np.all(y[0, :64] != 0)
