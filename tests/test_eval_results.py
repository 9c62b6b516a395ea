"""What any correct implementation must show in the quick eval's results.json.

The quick eval is produced by .ci/run (`turbo-llama eval --quick --out results/ci`); the fixture
reads $TURBO_LLAMA_EVAL_DIR (default results/ci) and runs the quick eval itself if it is missing.
"""
from __future__ import annotations

import math

import pytest
from conftest import missing

pytestmark = pytest.mark.slow

# Regression guard: mean KLD (vs the f16 cache) first measured with the implementation of
# patches/b11312 0001-0006 (CPU path checked against a dequantize-then-attend path and against
# CUDA in test-backend-ops), by `turbo-llama eval --quick` (Gemma 3 270M Q4_K_M, ctx 2048,
# 4 chunks of the Jargon File, CPU, 2026-11-29): q8_0 0.0054, q4_0 0.0978, turbo3 0.7406, turbo2 2.651.
# turbo3 is far above q4_0 on this model because of its keys (see K_COLLAPSE below).
TURBO3_KLD_FIRST = 0.7406
TURBO2_KLD_FIRST = 2.651
KLD_REGRESSION_FACTOR = 1.25


def _kld(res, t):
    r = res["ppl"].get(t)
    if r is None:
        missing(f"{t} not in the eval results ({res.get('errors', {}).get(t, 'not run')})")
    return r["kld_mean"]


def test_eval_finished(eval_results):
    assert eval_results["status"] == "done"
    assert eval_results["model"]["sha256"]
    assert eval_results["commands"]


def test_every_ppl_finite(eval_results):
    assert "f16" in eval_results["ppl"], eval_results.get("errors")
    for t in eval_results["types"]:
        assert t in eval_results["ppl"], f"{t}: {eval_results.get('errors', {}).get(t)}"
        r = eval_results["ppl"][t]
        assert math.isfinite(r["ppl"]) and r["ppl"] > 1, (t, r["ppl"])
        if t != "f16":
            assert math.isfinite(r["kld_mean"]) and r["kld_mean"] >= 0, (t, r.get("kld_mean"))


def test_kv_bytes_follow_bits_per_value(eval_results):
    """llama's own KV size lines: each type's bytes/token/layer = bits/value of the f16 size / 16."""
    f16 = eval_results["ppl"]["f16"]["kv"]["bytes_per_token_per_layer"]
    for t, r in eval_results["ppl"].items():
        bpv = r.get("bits_per_value")
        if bpv and r.get("kv"):
            assert r["kv"]["bytes_per_token_per_layer"] == pytest.approx(f16 * bpv / 16, rel=0.02), t


@pytest.mark.parametrize("lo,hi", [("q8_0", "turbo3"), ("turbo3", "turbo2"), ("q8_0", "q4_0")])
def test_kld_order(eval_results, lo, hi):
    if lo not in eval_results["ppl"] or hi not in eval_results["ppl"]:
        missing(f"{lo} or {hi} not measured")
    assert _kld(eval_results, lo) < _kld(eval_results, hi)


@pytest.mark.parametrize("t,first", [("turbo3", TURBO3_KLD_FIRST), ("turbo2", TURBO2_KLD_FIRST)])
def test_kld_regression_guard(eval_results, t, first):
    assert _kld(eval_results, t) < KLD_REGRESSION_FACTOR * first


def _found(res, t):
    r = res.get("niah_results", {}).get(t)
    if not r:
        missing(f"no NIAH results for {t} ({res.get('errors', {}).get(t, 'not run')})")
    return r


def test_f16_finds_needles(eval_results):
    """The harness itself: the f16 baseline must recover most needles on the quick grid."""
    f16 = _found(eval_results, "f16")
    assert sum(f16.values()) >= 0.8 * len(f16), f16


def test_same_prompts_for_every_type(eval_results):
    cells = {(c["length"], c["depth"]) for c in eval_results["niah"]["cells"]}
    for t, raw in eval_results["niah_raw"].items():
        assert {(r["length"], r["depth"]) for r in raw} == cells
        keys = {(c["length"], c["depth"]): c["key"] for c in eval_results["niah"]["cells"]}
        assert all(r["key"] == keys[(r["length"], r["depth"])] for r in raw)


# The finding on the default model (results/README notes, issue #8): K error, not V, breaks this
# 270M model: llama-perplexity c=2048, 1 chunk: f16 4.57, turbo3 K + f16 V 8.19, f16 K + turbo3 V
# 4.60. Its keys carry QK-norm gains up to 24x; at 3 (2) bits the needle's digits come back
# garbled ("480011" for "48011"). Recorded as strict xfails: they start failing the day K is fixed.
K_COLLAPSE = pytest.mark.xfail(
    strict=True,
    reason="turbo K collapses on Gemma 3 270M (quick eval: turbo3 1/9, turbo2 0/9 needles vs f16 9/9; "
           "turbo3 K alone takes PPL 4.57 -> 8.19). Fix tracked in issue #8 (keys that survive).")


@K_COLLAPSE
def test_turbo3_recovers_every_f16_needle(eval_results):
    f16, t3 = _found(eval_results, "f16"), _found(eval_results, "turbo3")
    missed = [k for k, ok in f16.items() if ok and not t3.get(k)]
    assert not missed, f"turbo3 missed needles f16 found: {missed}"


@K_COLLAPSE
def test_turbo2_recovers_most_f16_needles(eval_results):
    f16, t2 = _found(eval_results, "f16"), _found(eval_results, "turbo2")
    n_f16 = sum(f16.values())
    n_t2 = sum(1 for k, ok in f16.items() if ok and t2.get(k))
    assert n_t2 >= 0.8 * n_f16, (n_t2, n_f16)


def test_kld_base_size_as_predicted(eval_results, model_path):
    """The f16 base logits file was as large as we budget disk for (and it was deleted)."""
    from turbo_llama.eval import kld_base_bytes
    s = eval_results["settings"]
    got = eval_results["ppl"]["f16"]["kld_base_bytes"]
    assert abs(got - kld_base_bytes(model_path, s["ctx"], s["chunks"])) < 1024
