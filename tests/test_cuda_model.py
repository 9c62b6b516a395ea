"""The tensor-core decode kernel's index algebra (cuda/fattn-turbo-mma.cuh), checked on the CPU.

cuda/sim_fattn_mma.py replays what each lane of a warp loads, which pair-table entries it picks and how the
mma.m16n8k16 / movmatrix fragments are laid out (PTX ISA layouts), on codes made by the bindings, and compares
the warp's output with attention computed directly from the codes. The kernel itself is checked on the H200
by test-backend-ops (results/gpu.md); CI has no GPU, this catches a wrong lane/dimension mapping here.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

SIM = Path(__file__).resolve().parents[1] / "cuda" / "sim_fattn_mma.py"


@pytest.fixture(scope="module")
def sim():
    spec = importlib.util.spec_from_file_location("sim_fattn_mma", SIM)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("variant", [4, 8])
@pytest.mark.parametrize("D,qk", [(128, 128), (256, 128), (64, 64)])
@pytest.mark.parametrize("kbits,vbits", [(3, 3), (2, 2), (3, 2), (2, 3)])
@pytest.mark.parametrize("n_kv", [16, 50])
def test_mma_fragment_model_matches_attention(sim, D, qk, kbits, vbits, n_kv, variant):
    """qk = 64: the 64-value types at D = 64 (their d = 64 codebooks, the kernel's QKB = 64 loads and fragments)"""
    O, L, O_ref, R = sim.simulate(D, kbits, vbits, n_kv, seed=D + 10 * kbits + vbits + n_kv, variant=variant, qk=qk)
    out = O[:R] / L[:R, None]
    err = np.abs(out - O_ref[:R]).max() / np.abs(O_ref[:R]).max()
    assert err < 1e-9, f"v{variant} D={D} qk={qk} K turbo{kbits} V turbo{vbits} n_kv={n_kv}: relative error {err:.3g}"


@pytest.mark.parametrize("vplain", ["q8_0", "f16"])
@pytest.mark.parametrize("kbits", [3, 2])
@pytest.mark.parametrize("n_kv", [16, 50])
def test_mma_plain_v_fragment_model_matches_attention(sim, vplain, kbits, n_kv):
    """turbo K with a q8_0 or f16 V (tile_pv_plain): the f16 V's ldmatrix.trans of swizzled rows, the q8_0 V's
    conversion and movmatrix, and the epilogue's dims, against attention on V's values in the plain domain"""
    O, L, O_ref, R = sim.simulate(128, kbits, 0, n_kv, seed=7 * kbits + n_kv, vplain=vplain)
    err = np.abs(O[:R] / L[:R, None] - O_ref[:R]).max() / np.abs(O_ref[:R]).max()
    assert err < 1e-9, f"K turbo{kbits} V {vplain} n_kv={n_kv}: relative error {err:.3g}"


def test_plain_v_model_notices_a_wrong_matrix_order(sim, monkeypatch):
    """The plain-V model can fail: ldmatrix's matrices 1 and 2 swapped (keys 0-7 of dims 8-15 taken for keys 8-15
    of dims 0-7) is caught."""
    load = sim.ldmatrix_x4_trans

    def swapped(rows):
        return [[r[0], r[2], r[1], r[3]] for r in load(rows)]
    monkeypatch.setattr(sim, "ldmatrix_x4_trans", swapped)
    O, L, O_ref, R = sim.simulate(128, 3, 0, 50, seed=1, vplain="f16")
    assert np.abs(O[:R] / L[:R, None] - O_ref[:R]).max() / np.abs(O_ref[:R]).max() > 1e-3


def test_index_bytes_match_the_nibble_indexes(sim):
    """v8's index words (turbo_mma_idx4) give the same table index as v4's per-lookup cut, for every nibble,
    on random code words: the high bits of pair n sit at bits 2n, 2n+1 of hi (K: all 32 bits, 16 pairs)."""
    rng = np.random.default_rng(7)
    for lo0, lo1, hi in rng.integers(0, 2**32, (200, 3), dtype=np.uint64).tolist():
        for m in range(16):
            lo = lo0 if m < 8 else lo1
            want = ((lo >> (4 * (m & 7))) & 15) | (((hi >> (2 * m)) & 3) << 4)
            got = sim.idx4_pick(sim.idx4(lo, hi, 0x1100 if m < 8 else 0x3322, m & 1, 3), m & 7)
            assert got == want, (hex(lo), hex(hi), m)
            assert sim.idx4_pick(sim.idx4(lo, hi, 0x1100, m & 1, 2), m & 7) == (lo >> (4 * (m & 7))) & 15


def test_index_bytes_notice_a_wrong_selector(sim):
    """The byte check can fail: the high half's selector used for the low pairs is caught."""
    lo, hi = 0x76543210, 0x0000FFFF
    assert sim.idx4_pick(sim.idx4(lo, hi, 0x3322, 0, 3), 0) != sim.idx4_pick(sim.idx4(lo, hi, 0x1100, 0, 3), 0)


def test_model_notices_a_wrong_lane_mapping(sim, monkeypatch):
    """The model can fail: swapping the two keys of a V pair (a plausible kernel bug) is caught."""
    make = sim.pair_table

    def swapped(bits, qk=128):
        t = make(bits, qk)
        return t[:, ::-1].copy()
    monkeypatch.setattr(sim, "pair_table", swapped)
    O, L, O_ref, R = sim.simulate(128, 3, 3, 50, seed=1)
    err = np.abs(O[:R] / L[:R, None] - O_ref[:R]).max() / np.abs(O_ref[:R]).max()
    assert err > 1e-3


@pytest.mark.parametrize("D,qk,vplain", [(128, 128, None), (256, 128, None), (64, 64, None),
                                         (128, 128, "f16"), (128, 128, "q8_0"), (256, 128, "f16"), (256, 128, "q8_0")])
def test_epilogue_stores_fall_on_32_banks(sim, D, qk, vplain):
    """The epilogue's shared-memory layout of the warps' outputs (turbo_mma_smem::os_at): every store instruction of a
    warp (chunk j, one of its four values) puts its 32 lanes on 32 different banks (unpadded rows of D floats put them
    on 2: run 38's 11.6-way conflicts), and the 4 warps' 8 rows x D dims get distinct words inside NL*8*OS"""
    OS, os_at = sim.epilogue_layout(D, qk)
    n_j = (D // qk) * (qk // 16) if vplain is None else 8   # a plain V: a warp's 8 chunks of its 128-block
    for j in range(n_j):
        for dr, dd in ((0, 0), (1, 0), (0, 1), (1, 1)):
            banks = set()
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                d, DD = sim.epilogue_dims(j, g, qk, vplain)
                banks.add(os_at(2 * t + dr, d + dd * DD) % 32)
            assert len(banks) == 32, f"D={D} V {vplain or 'turbo'} chunk {j}: {32 - len(banks)} lanes share a bank"
    words = {os_at(r, d) for r in range(4 * 8) for d in range(D)}
    assert len(words) == 4 * 8 * D and max(words) < 4 * 8 * OS
