"""Unit tests of the eval harness: parsers on captured real llama.cpp output, NIAH prompts, outputs."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from turbo_llama.eval import niah
from turbo_llama.eval.llama_tools import (UnsupportedCacheType, check_unsupported, parse_kv_cache,
                                     parse_perplexity)

DATA = Path(__file__).parent / "data"


# ------------------------------------------------------------------------------------- parsers
def test_parse_kld_run_real_output():
    r = parse_perplexity((DATA / "perplexity_kld_q8_0.txt").read_text())
    assert r["ppl"] == pytest.approx(10.268721) and r["ppl_err"] == pytest.approx(0.703148)
    assert r["ppl_base"] == pytest.approx(10.254833)
    assert r["ppl_ratio"] == pytest.approx(1.001354)
    assert r["kld_mean"] == pytest.approx(0.005626) and r["kld_mean_err"] == pytest.approx(0.000188)
    assert r["kld_p99"] == pytest.approx(0.036389)    # the "99.0%   KLD:" line, not "99.9%"
    assert r["kld_p999"] == pytest.approx(0.077538)
    assert r["kld_max"] == pytest.approx(0.125158)
    assert r["kld_median"] == pytest.approx(0.003335)
    assert r["same_top"] == pytest.approx(96.285) and r["same_top_err"] == pytest.approx(0.418)
    assert r["dp_rms"] == pytest.approx(1.634)


def test_parse_base_run_real_output():
    r = parse_perplexity((DATA / "perplexity_base_f16.txt").read_text())
    assert r["ppl"] == pytest.approx(10.2548) and r["ppl_err"] == pytest.approx(0.70186)
    assert "kld_mean" not in r


def test_parse_kv_cache_iswa_sums_both_caches():
    kv = parse_kv_cache((DATA / "kv_cache_iswa_q8_0.txt").read_text())
    assert len(kv["caches"]) == 2                      # Gemma 3: non-SWA + SWA cache
    assert kv["kv_mib"] == pytest.approx(3.19 + 15.94)
    assert kv["n_layers"] == 18
    assert {c["type_k"] for c in kv["caches"]} == {"q8_0"}
    # q8_0: 34 bytes per 32 values; K and V of 1 KV head x head_dim 256
    assert kv["bytes_per_token_per_layer"] == pytest.approx(2 * 256 * 34 / 32, rel=0.01)


def test_parse_kv_cache_synthetic_single_cache():
    line = ("0.00.9 I llama_kv_cache: size =  256.00 MiB (  2048 cells,  32 layers,  1/1 seqs), "
            "K (f16):  128.00 MiB, V (f16):  128.00 MiB\n")
    kv = parse_kv_cache(line)
    assert kv["kv_mib"] == 256 and kv["k_mib"] == 128
    assert kv["bytes_per_token_per_layer"] == pytest.approx(256 * 2**20 / (2048 * 32))
    assert parse_kv_cache("nothing here") is None
    assert kv["caches"][0]["window"] is None


def test_parse_kv_cache_finds_each_caches_window():
    """The window line a cache's constructor prints before its size line belongs to that cache (iSWA: two caches)."""
    size = ("llama_kv_cache: size =  {} MiB (  {} cells,  {} layers,  1/1 seqs), "
            "K ({}):  1.00 MiB, V (turbo3):  1.00 MiB\n")
    window = "llama_kv_cache: turbo window: the last {} cells of each stream also kept as K {}, V q8_0 rows (TURBO_WINDOW=0: none)\n"
    log = (window.format(576, "q8_0") + size.format("2.00", 2048, 3, "turbo3")
           + size.format("2.00", 1024, 15, "f16") + window.format(512, "q8_0") + size.format("2.00", 512, 2, "q8_0"))
    kv = parse_kv_cache(log)
    assert [c["window"] for c in kv["caches"]] == [dict(rows=576, type_k="q8_0", type_v="q8_0"), None,
                                                  dict(rows=512, type_k="q8_0", type_v="q8_0")]


def test_unsupported_cache_type_messages():
    with pytest.raises(UnsupportedCacheType, match="turbo3"):
        check_unsupported("error while handling argument \"-ctk\": Unsupported cache type: turbo3", "turbo3")
    with pytest.raises(UnsupportedCacheType):
        check_unsupported("error: invalid parameter for argument: -ctk\nusage: ...", "turbo2")
    check_unsupported("Final estimate: PPL = 1.0 +/- 0.1", "q8_0")  # no error


# ------------------------------------------------------------------------------------- NIAH
def _ws_tokenizer():
    """A whitespace tokenizer: one token per word (ids are the words themselves)."""
    return (lambda text: text.split()), (lambda toks: " ".join(toks))


HAY = " ".join(f"Sentence number {i} says the lamb and the lion rest." for i in range(3000))


def test_niah_cells_grid_keys_and_lengths():
    tok, detok = _ws_tokenizer()
    cells = niah.build_cells(HAY, [256, 512], [0.1, 0.5, 0.9], tok, detok, seed=1)
    assert [(c.length, c.depth) for c in cells] == [(L, d) for L in (256, 512) for d in (0.1, 0.5, 0.9)]
    assert len({c.key for c in cells}) == len(cells)             # a different key per cell
    for c in cells:
        assert re.fullmatch(r"\d{5}", c.key)
        assert c.prompt.count(c.key) == 1                         # the key only in the needle
        assert niah.needle_sentence(c.key).strip() in c.prompt
        assert c.prompt.endswith(niah.QUESTION)                  # the base model completes the sentence
        # cut to the length in tokens (ending on a whole sentence: at most one sentence shorter)
        assert c.length - 40 <= c.n_tokens <= c.length


def test_niah_needle_at_depth():
    tok, detok = _ws_tokenizer()
    for c in niah.build_cells(HAY, [400, 800], [0.0, 0.25, 0.5, 0.75, 1.0], tok, detok):
        hay_start = len(niah.INTRO)
        hay_end = len(c.prompt) - len(niah.QUESTION)
        pos = c.prompt.index(niah.needle_sentence(c.key).strip())
        frac = (pos - hay_start) / (hay_end - hay_start)
        assert abs(frac - c.depth) < 0.06, (c.length, c.depth, frac)
        assert abs(c.needle_depth - c.depth) < 0.06
        # never inside a sentence: what precedes the needle ends a sentence (or is the intro)
        before = c.prompt[:pos].rstrip()
        assert before.endswith((".", ";", ":", "?", "!")) or pos <= hay_start + 1


def test_niah_same_prompts_every_time():
    """Prompts depend only on (haystack, grid, seed, tokenizer): every cache type gets the same."""
    tok, detok = _ws_tokenizer()
    a = niah.build_cells(HAY, [300, 600], [0.1, 0.9], tok, detok)
    b = niah.build_cells(HAY, [300, 600], [0.1, 0.9], tok, detok)
    assert [c.to_json(with_prompt=True) for c in a] == [c.to_json(with_prompt=True) for c in b]
    c = niah.build_cells(HAY, [300, 600], [0.1, 0.9], tok, detok, seed=niah.SEED + 1)
    assert [x.key for x in a] != [x.key for x in c]


def test_niah_scoring_exact_key():
    assert niah.found("48011", " 48011.\n")
    assert niah.found("48011", "is 48011")
    assert not niah.found("48011", " 480110.")
    assert not niah.found("48011", " 4801.")
    assert not niah.found("48011", "")


def test_niah_request_is_greedy():
    r = niah.completion_request("x")
    assert r["temperature"] == 0 and r["top_k"] == 1 and r["n_predict"] == niah.N_PREDICT


def test_full_lengths_reach_training_context():
    assert niah.full_lengths(32768) == (1024, 2048, 4096, 8192, 16384, 32768)
    assert niah.full_lengths(6000)[-1] == 6000
    assert len(niah.FULL_DEPTHS) == 10


# ------------------------------------------------------------------------------------- outputs
def _fake_results() -> dict:
    types = ["f16", "q8_0", "turbo3"]
    return {
        "status": "done", "types": types, "model": {"path": "/m/model.gguf"},
        "settings": {"ctx": 2048, "chunks": 4, "backend": "cpu", "threads": 2, "text": "/t/jargon.txt"},
        "ppl": {"f16": {"ppl": 10.0, "ppl_err": 0.5, "bits_per_value": 16.0,
                        "kv": {"kv_mib": 36.0, "bytes_per_token_per_layer": 1024.0}},
                "q8_0": {"ppl": 10.1, "ppl_err": 0.5, "kld_mean": 0.005, "kld_mean_err": 0.0002,
                         "kld_p99": 0.03, "same_top": 96.0, "bits_per_value": 8.5,
                         "kv": {"kv_mib": 19.1, "bytes_per_token_per_layer": 544.0}}},
        "niah": {"lengths": [1024, 2048], "depths": [0.1, 0.9],
                 "cells": [{"length": L, "depth": d} for L in (1024, 2048) for d in (0.1, 0.9)]},
        "niah_results": {"f16": {"1024@0.1": True, "1024@0.9": True, "2048@0.1": True, "2048@0.9": True},
                         "q8_0": {"1024@0.1": True, "1024@0.9": False, "2048@0.1": True, "2048@0.9": True}},
        "errors": {"turbo3": "perplexity: this llama.cpp build does not support KV-cache type 'turbo3'"},
        "timings": {"total": 12.0},
    }


def test_markdown_table(tmp_path):
    from turbo_llama.eval.report import render_markdown
    md = render_markdown(_fake_results())
    rows = {l.split("|")[1].strip(): l for l in md.splitlines() if l.startswith("| ")}
    assert "10.1000 ± 0.5000" in rows["q8_0"] and "1.0100" in rows["q8_0"] and "3/4" in rows["q8_0"]
    assert "4/4" in rows["f16"] and "36.00" in rows["f16"]
    assert "error" in rows["turbo3"] and "does not support" in md


def test_plots_written(tmp_path):
    from turbo_llama.eval import plots
    res = _fake_results()
    for f in (plots.niah_png(res, tmp_path / "niah.png"), plots.kld_png(res, tmp_path / "kld.png")):
        assert f is not None and f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_niah_run_order_needle_furthest_first():
    tok, detok = _ws_tokenizer()
    cells = niah.build_cells(HAY, [300, 600], [0.1, 0.5, 0.9], tok, detok)
    order = niah.run_order(cells)
    assert sorted(order) == list(range(len(cells)))
    pos = [cells[i].needle_char for i in order]
    assert pos == sorted(pos, reverse=True)
    # each later prompt shares its whole text up to its needle with the previous one
    for a, b in zip(order, order[1:]):
        assert cells[a].prompt[: cells[b].needle_char] == cells[b].prompt[: cells[b].needle_char]


def test_markdown_warns_when_f16_misses_needles():
    from turbo_llama.eval.report import render_markdown
    res = _fake_results()
    res["niah_results"]["f16"] = {"1024@0.1": False, "1024@0.9": False, "2048@0.1": True, "2048@0.9": False}
    assert "warning: the f16 baseline found only 1/4" in render_markdown(res)
    assert "warning" not in render_markdown(_fake_results())


def _two_text_results() -> dict:
    res = _fake_results()
    res["types"] = ["f16", "q8_0", "turbo3"]
    def fig(ppl, kld=None):
        return {"ppl": ppl, "ppl_err": 0.1, **({"kld_mean": kld} if kld is not None else {})}
    jargon = {"f16": fig(10.0), "q8_0": fig(10.1, 0.005), "turbo3": fig(10.2, 0.03)}
    code = {"f16": fig(2.0), "q8_0": fig(2.01, 0.006), "turbo3": fig(2.1, 0.02)}
    res["ppl_by_text"] = {"jargon": jargon, "code": code}
    res["ppl"] = jargon
    res["errors"] = {}
    return res


def test_worst_of_texts_takes_each_figure_from_the_text_where_it_is_worst():
    from turbo_llama.eval.report import worst_by_text
    w = worst_by_text(_two_text_results())
    # turbo3: PPL ratio 1.05 on code beats 1.02 on jargon; its KLD is worst on jargon (0.03 > 0.02)
    assert w["turbo3"]["ppl_ratio"] == pytest.approx(1.05) and w["turbo3"]["ppl_text"] == "code"
    assert w["turbo3"]["kld_mean"] == pytest.approx(0.03) and w["turbo3"]["kld_text"] == "jargon"
    assert w["q8_0"]["ppl_ratio"] == pytest.approx(1.01) and w["q8_0"]["kld_text"] == "code"
    assert "f16" not in w


def test_markdown_lists_each_text_and_the_worst():
    from turbo_llama.eval.report import render_markdown
    md = render_markdown(_two_text_results())
    assert "## Each text, and the worst" in md
    row = next(l for l in md.splitlines() if l.startswith("| turbo3 |") and "(code)" in l)
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells == ["turbo3", "1.0200", "0.030000", "1.0500", "0.020000", "1.0500 (code)", "0.030000 (jargon)"]
    # one text: no per-text section
    one = _two_text_results()
    one["ppl_by_text"] = {"jargon": one["ppl"]}
    assert "Each text" not in render_markdown(one)
