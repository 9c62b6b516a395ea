"""The checked-in codebook header is what cpu_ref/scripts/gen_codebooks.py produces."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "cpu_ref" / "turbo-codebooks.h"
SCRIPT = ROOT / "cpu_ref" / "scripts" / "gen_codebooks.py"


def arrays(text):
    out = {}
    for name, body in re.findall(r"static const \w+(?: \w+)? (\w+)\[\d+\] = \{([^}]*)\}", text):
        values = [v.strip() for v in body.split(",") if v.strip()]
        out[name] = [int(v.rstrip("u"), 16) if v.startswith("0x") else float(v.rstrip("f")) for v in values]
    return out


@pytest.fixture(scope="module")
def regenerated():
    return subprocess.run([sys.executable, str(SCRIPT), "--dim", "128"], check=True,
                          capture_output=True, text=True).stdout


def test_header_matches_script(regenerated):
    checked_in = arrays(HEADER.read_text())
    fresh = arrays(regenerated)
    assert set(checked_in) == {"turbo_sign_words", "turbo3_centroids", "turbo3_boundaries",
                               "turbo2_centroids", "turbo2_boundaries", "turbo4_centroids", "turbo4_boundaries"}
    assert checked_in.keys() == fresh.keys()
    assert checked_in["turbo_sign_words"] == fresh["turbo_sign_words"]
    for name in checked_in:
        for a, b in zip(checked_in[name], fresh[name]):
            assert a == pytest.approx(b, rel=1e-7, abs=1e-12), name
    assert "gen_codebooks.py --dim 128" in HEADER.read_text().splitlines()[0]


def test_codebooks_are_lloyd_max_optima(regenerated):
    mse = dict(re.findall(r"#define TURBO(\d)_MSE_X_DIM ([0-9.]+)", regenerated))
    # Lloyd-Max optimum for the exact coordinate law at d=128 (DEVELOPERS.md: 0.0340 / 0.116)
    assert float(mse["3"]) == pytest.approx(0.0340, abs=0.0002)
    assert float(mse["2"]) == pytest.approx(0.116, abs=0.0005)
    # 4 bits: below the Gaussian's 4-bit Lloyd-Max figure (0.009497) by about as much as 3 bits is (0.03454)
    assert float(mse["4"]) == pytest.approx(0.00931, abs=0.00005)
    c = arrays(regenerated)
    for bits in (4, 3, 2):
        cent, bound = c[f"turbo{bits}_centroids"], c[f"turbo{bits}_boundaries"]
        assert len(cent) == 2 ** bits and cent == sorted(cent)
        assert all(abs(x + y) < 1e-9 for x, y in zip(cent, reversed(cent)))  # symmetric
        for i, b in enumerate(bound):  # boundaries are midpoints (nearest-centroid rule)
            assert b == pytest.approx((cent[i] + cent[i + 1]) / 2, abs=1e-9)


def test_signs_are_balanced():
    words = arrays(HEADER.read_text())["turbo_sign_words"]
    ones = sum(bin(w).count("1") for w in words)
    assert 48 <= ones <= 80  # a random-looking diagonal, not all +1 (which would be a plain FWHT)
