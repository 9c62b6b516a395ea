"""CI's quality guard (#28): the quick eval on Gemma and the short Qwen check against committed figures.

tests/data/eval_reference.json holds, per model, the PPL ratio to f16 and the mean KLD of each guarded
cache from a reference run, Qwen's also on a second text (caches_by_text); the lead updates it from final
runs and its "source" says which. A guarded figure fails when it regresses by more than a quarter of its
distance from the ideal (PPL ratio: from 1; KLD: from 0), with a floor of GUARD_FLOOR for the arithmetic's own
noise between CPUs.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

REFERENCE = Path(__file__).parent / "data" / "eval_reference.json"
GUARD_SHARE = 0.25
GUARD_FLOOR = 0.001


def figures(res: dict) -> dict[str, dict[str, float]]:
    """{cache: {"ppl_ratio": PPL / PPL(f16), "kld_mean": ...}} of an eval's results.json."""
    base = res["ppl"]["f16"]["ppl"]
    return {t: {"ppl_ratio": r["ppl"] / base, "kld_mean": r.get("kld_mean", 0.0)}
            for t, r in res["ppl"].items() if t != "f16"}


def limit(name: str, ref: float) -> float:
    ideal = 1.0 if name == "ppl_ratio" else 0.0
    return ref + max(GUARD_SHARE * abs(ref - ideal), GUARD_FLOOR)


def regressions(res: dict, ref: dict) -> list[str]:
    """What regressed beyond the guard, as readable lines (empty: all good). A guarded cache missing from
    the results is a failure too (the guard must not pass by not measuring)."""
    got = figures(res)
    out = []
    for cache, ref_figs in ref["caches"].items():
        if cache not in got:
            out.append(f"{cache}: not measured ({res.get('errors', {}).get(cache, 'not in the results')})")
            continue
        for name, r in ref_figs.items():
            if got[cache][name] > limit(name, r):
                out.append(f"{cache} {name}: {got[cache][name]:.4f} > {limit(name, r):.4f} "
                           f"(reference {r:.4f} + a quarter of its distance from the ideal)")
    return out


def _fake(ppl: dict[str, float], kld: dict[str, float]) -> dict:
    return {"ppl": {t: {"ppl": p, **({"kld_mean": kld[t]} if t in kld else {})} for t, p in ppl.items()}}


def test_guard_rule():
    ref = {"caches": {"turbo3": {"ppl_ratio": 1.10, "kld_mean": 0.12}, "q8_0": {"ppl_ratio": 0.9998, "kld_mean": 0.005}}}
    ok = _fake({"f16": 10.0, "turbo3": 11.24, "q8_0": 10.0}, {"turbo3": 0.149, "q8_0": 0.0055})
    assert regressions(ok, ref) == []
    worse = _fake({"f16": 10.0, "turbo3": 11.26, "q8_0": 10.0}, {"turbo3": 0.151, "q8_0": 0.0055})
    lines = regressions(worse, ref)
    assert len(lines) == 2 and lines[0].startswith("turbo3 ppl_ratio: 1.1260 > 1.1250")
    assert "kld_mean" in lines[1]
    # q8_0 near 1: the floor, not a quarter of 0.0002, bounds the noise
    assert regressions(_fake({"f16": 10.0, "turbo3": 11.0, "q8_0": 10.008}, {"turbo3": 0.12, "q8_0": 0.005}), ref) == []
    assert regressions(_fake({"f16": 10.0, "q8_0": 10.0}, {"q8_0": 0.005}), ref)[0].startswith("turbo3: not measured")


def _reference(model: str, res: dict) -> dict:
    refs = json.loads(REFERENCE.read_text())
    ref = refs["models"][model]
    if res["model"]["sha256"] != ref["sha256"]:
        pytest.fail(f"the eval ran another model ({res['model']['sha256']}) than the reference's ({ref['sha256']})")
    s = res["settings"]
    if (s["ctx"], s["chunks"]) != (ref["ctx"], ref["chunks"]):
        pytest.fail(f"the eval ran ctx {s['ctx']} x {s['chunks']} chunks, the reference {ref['ctx']} x {ref['chunks']}")
    return ref


@pytest.mark.slow
def test_gemma_quick_eval_within_guard(eval_results):
    ref = _reference("gemma3-270m", eval_results)
    assert regressions(eval_results, ref) == []


@pytest.mark.slow
def test_qwen_check_within_guard(qwen_results):
    ref = _reference("qwen2.5-coder-1.5b", qwen_results)
    # turbo4 is guarded where the build has it (ci/run.sh asks for it then: cache_types.qwen_check_types)
    def guarded(caches: dict) -> dict:
        return {t: f for t, f in caches.items() if t != "turbo4" or "turbo4" in qwen_results["types"]}
    lines = regressions(qwen_results, {"caches": guarded(ref["caches"])})
    # the second text (#51): a key quantizer tuned on one text must hold on the other
    by_text = qwen_results.get("ppl_by_text") or {}
    for text, text_ref in ref.get("caches_by_text", {}).items():
        if text not in by_text:
            lines.append(f"{text}: not measured (the check ran {', '.join(by_text) or 'no text'})")
            continue
        lines += [f"{text}: {line}" for line in regressions({"ppl": by_text[text]}, {"caches": guarded(text_ref)})]
    assert lines == []
