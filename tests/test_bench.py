"""turbo-llama bench: llama-bench JSON parsing, the table, random-shape GGUFs, a tiny real run."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from turbo_llama.bench.run import parse_bench_json, render_table, summarize
from turbo_llama.bench.shapes import SHAPES, Shape, write_random_gguf

DATA = Path(__file__).parent / "data"


def test_parse_real_llama_bench_json():
    rows = parse_bench_json((DATA / "llama_bench_tiny_f16.json").read_text())
    assert {(r["test"], r["depth"]) for r in rows} == {("pp", 0), ("pp", 256), ("tg", 0), ("tg", 256)}
    assert all(r["type"] == "f16" and r["tps"] > 0 for r in rows)
    assert {r["label"] for r in rows} == {"pp32", "tg8"}


def test_table_ratios_to_f16():
    rows = [{"type": t, "test": "tg", "label": "tg128", "depth": 0, "tps": v}
            for t, v in (("f16", 100.0), ("turbo3", 80.0))]
    md = render_table(rows, ["f16", "turbo3", "turbo2"])
    assert "100.00" in md and "80.00 (0.800)" in md and "turbo2" not in md


def test_rounds_take_ratios_within_each_round():
    """--rounds: the ratio is the median of each round's ratio to f16 of that round, not a ratio of medians, so
    a machine that slows down between rounds moves neither f16's nor turbo3's ratio."""
    rows = [{"type": t, "test": "tg", "label": "tg128", "depth": 0, "tps": v, "round": k}
            for k, (a, b) in enumerate(((100.0, 95.0), (80.0, 72.0), (120.0, 96.0))) for t, v in (("f16", a), ("turbo3", b))]
    s = {r["type"]: r for r in summarize(rows)}
    assert s["turbo3"]["round_tps"] == [95.0, 72.0, 96.0] and s["turbo3"]["tps"] == 95.0
    assert s["turbo3"]["ratio"] == pytest.approx(0.9) and s["turbo3"]["ratio_min"] == pytest.approx(0.8)
    assert s["turbo3"]["tps"] / s["f16"]["tps"] == pytest.approx(0.95)   # the ratio of the medians differs
    assert "ratio" not in s["f16"]
    md = render_table(rows, ["f16", "turbo3"])
    assert "| tg128 | 0 | 100.00 | 95.00 (0.900, 0.800-0.950) |" in md


FAKE_BENCH = """#!{python}
# a stand-in for llama-bench: the recorded tiny-model JSON as -ctk's type, every call 10% slower than the one
# before (a drifting machine), and a failure for q4_0
import json, pathlib, sys
a = sys.argv
if "--version" in a:
    print("version: fake"); sys.exit(0)
t = a[a.index("-ctk") + 1]
calls = pathlib.Path(__file__).with_name("calls.txt")
with calls.open("a") as f:
    f.write(t + "\\n")
if t == "q4_0":
    print("error: something broke", file=sys.stderr); sys.exit(1)
k = len(calls.read_text().split())
recs = json.loads(pathlib.Path({data!r}).read_text())
for r in recs:
    r["type_k"] = r["type_v"] = t
    r["avg_ts"] = (80.0 if t == "turbo3" else 100.0) * 0.9 ** k
print(json.dumps(recs))
"""


def test_rounds_with_a_drifting_machine_and_a_failing_type(tmp_path, monkeypatch):
    """run_bench --rounds with a fake llama-bench on a machine that slows down by 10% per call: each round's ratio
    is turbo3 against f16 of that round (0.8 x 0.9^(calls between them)), the table gives their median and range;
    a type that fails is reported once and not run again in later rounds."""
    import sys
    from turbo_llama.bench.run import run_bench
    exe = tmp_path / "bin" / "llama-bench"
    exe.parent.mkdir()
    exe.write_text(FAKE_BENCH.format(python=sys.executable, data=str(DATA / "llama_bench_tiny_f16.json")))
    exe.chmod(0o755)
    monkeypatch.setenv("TURBO_LLAMA_BIN_DIR", str(exe.parent))
    out = tmp_path / "out"
    res = run_bench(model_path=tmp_path / "m.gguf", random_shape=None, types=["f16", "q4_0", "turbo3"],
                    depths=[0, 256], p=32, n=8, backend="cpu", threads=1, reps=1, repack=False, out=out,
                    progress=False, rounds=3)
    assert (exe.parent / "calls.txt").read_text().split() == ["f16", "q4_0", "turbo3", "f16", "turbo3", "f16", "turbo3"]
    assert list(res["errors"]) == ["q4_0"] and "something broke" in res["errors"]["q4_0"]
    t3 = [r for r in res["rows"] if r["type"] == "turbo3"]
    assert len(t3) == 4 and all(len(r["round_tps"]) == 3 for r in t3)
    for r in t3:   # round 1: f16 is call 1, turbo3 call 3 (after q4_0's); rounds 2, 3: calls 4, 5 and 6, 7
        assert (r["ratio"], r["ratio_min"], r["ratio_max"]) == pytest.approx((0.72, 0.648, 0.72))
    md = (out / "bench.md").read_text()
    assert "in each of 3 rounds" in md and "## Errors" in md and "q4_0" in md
    assert len(json.loads((out / "bench.json").read_text())["round_rows"]) == 24


FAKE_SWITCH_BENCH = """#!{python}
# a stand-in for llama-bench: turbo3 at 80 t/s, twice that when FAKE_FAST=1 is in its environment
import json, os, pathlib, sys
a = sys.argv
if "--version" in a:
    print("version: fake"); sys.exit(0)
t = a[a.index("-ctk") + 1]
with pathlib.Path(__file__).with_name("calls.txt").open("a") as f:
    f.write(t + ("+fast" if os.environ.get("FAKE_FAST") == "1" else "") + "\\n")
recs = json.loads(pathlib.Path({data!r}).read_text())
for r in recs:
    r["type_k"] = r["type_v"] = t
    r["avg_ts"] = 100.0 if t == "f16" else 80.0 * (2 if os.environ.get("FAKE_FAST") == "1" else 1)
print(json.dumps(recs))
"""


def test_type_with_an_environment_switch(tmp_path, monkeypatch):
    """--types f16,turbo3,turbo3+FAKE_FAST=1: the variant runs with the switch in its environment only, in the same
    rounds, and its rows keep its own name; malformed specs are refused with the spec in the message."""
    import sys
    from turbo_llama.bench.run import parse_type_spec, run_bench
    assert parse_type_spec("turbo3") == ("turbo3", {})
    assert parse_type_spec("turbo3+TURBO_PDL=1+TURBO_FA_MMA=9") == ("turbo3", {"TURBO_PDL": "1", "TURBO_FA_MMA": "9"})
    for bad in ("turbo3+", "turbo3+TURBO_PDL", "+TURBO_PDL=1", "turbo3+lower=1", "turbo3+A=1+A=2"):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            parse_type_spec(bad)
    exe = tmp_path / "bin" / "llama-bench"
    exe.parent.mkdir()
    exe.write_text(FAKE_SWITCH_BENCH.format(python=sys.executable, data=str(DATA / "llama_bench_tiny_f16.json")))
    exe.chmod(0o755)
    monkeypatch.setenv("TURBO_LLAMA_BIN_DIR", str(exe.parent))
    monkeypatch.delenv("FAKE_FAST", raising=False)
    out = tmp_path / "out"
    res = run_bench(model_path=tmp_path / "m.gguf", random_shape=None, types=["f16", "turbo3", "turbo3+FAKE_FAST=1"],
                    depths=[0], p=32, n=8, backend="cpu", threads=1, reps=1, repack=False, out=out,
                    progress=False, rounds=2)
    assert (exe.parent / "calls.txt").read_text().split() == ["f16", "turbo3", "turbo3+fast"] * 2
    ratio = {(r["type"], r["test"]): r.get("ratio") for r in res["rows"]}
    assert ratio[("turbo3", "tg")] == pytest.approx(0.8) and ratio[("turbo3+FAKE_FAST=1", "tg")] == pytest.approx(1.6)
    assert [c["cmd"].split()[0] for c in res["commands"][:3]] == [str(exe), str(exe), "FAKE_FAST=1"]
    assert "| turbo3+FAKE_FAST=1 t/s" in (out / "bench.md").read_text()
    assert (out / "llama-bench-turbo3_FAKE_FAST=1-r2.log").is_file()


def test_bench_command_refuses_a_malformed_type():
    from click.testing import CliRunner
    from turbo_llama.bench.cli import bench_command
    r = CliRunner().invoke(bench_command, ["--types", "f16,turbo3+PDL"])
    assert r.exit_code == 2 and "turbo3+PDL" in r.output


def test_bench_types_with_llama_bench_alone(tmp_path, monkeypatch, capsys):
    """A build of llama-bench alone (its --help lists no cache types) runs unchecked, with a note; with no tool at all
    the error names the fix; a listing tool still refuses a type the build lacks before any run."""
    from turbo_llama.bench import run as bench
    from turbo_llama.cache_types import CacheTypeError
    from turbo_llama.errors import ToolError
    have = {"llama-bench": tmp_path / "llama-bench"}

    def fake_find(name):
        if name not in have:
            raise ToolError(f"{name} not found")
        return have[name]

    monkeypatch.setattr(bench, "find_tool", fake_find)
    bench.check_bench_types(["f16", "turbo3", "q8_0/turbo3"])
    assert "not checked before the runs" in capsys.readouterr().err
    have.clear()
    with pytest.raises(ToolError, match="turbo-llama build"):
        bench.check_bench_types(["f16"])
    have["llama-perplexity"] = tmp_path / "llama-perplexity"
    monkeypatch.setattr(bench, "supported_types", lambda exe: ["f16", "q8_0", "turbo3"])
    with pytest.raises(CacheTypeError, match="turbo9"):
        bench.check_bench_types(["f16", "turbo9"])
    bench.check_bench_types(["f16", "q8_0/turbo3"])


def test_shapes_are_real_model_shapes():
    s = SHAPES["llama8b"]
    assert (s.n_layer, s.n_embd, s.n_head, s.n_head_kv, s.head_dim, s.n_ff, s.n_vocab) == \
        (32, 4096, 32, 8, 128, 14336, 128256)
    assert SHAPES["tiny"].head_dim == 128


def test_random_gguf_reads_back_without_nan(tmp_path):
    import gguf
    shape = Shape("t", 1, 256, 2, 1, 128, 512, 300, 1024)
    p = write_random_gguf(shape, tmp_path / "t.gguf")
    r = gguf.GGUFReader(str(p))
    names = {t.name: t for t in r.tensors}
    assert names["blk.0.attn_k.weight"].shape.tolist() == [256, 128]   # ggml order: n_in, n_out
    q = names["blk.0.ffn_down.weight"]
    assert q.tensor_type == gguf.GGMLQuantizationType.Q4_0
    vals = gguf.dequantize(q.data, q.tensor_type)
    assert np.isfinite(vals).all() and 0 < np.abs(vals).max() < 1
    assert len(r.fields["tokenizer.ggml.tokens"].data) == 300


@pytest.mark.slow
def test_tiny_shape_runs_in_llama_bench(tmp_path, llama_tool, monkeypatch):
    """Generate the tiny GGUF and run llama-bench on it for f16 and turbo3 in two rounds (parsing and the
    round bookkeeping only, no timing threshold)."""
    from turbo_llama.bench.run import run_bench
    from turbo_llama.bench.shapes import shape_gguf
    llama_tool("llama-bench")
    gg = shape_gguf("tiny", tmp_path)
    res = run_bench(model_path=gg, random_shape="tiny", types=["f16", "turbo3"], depths=[0, 64], p=32, n=8,
                    backend="cpu", threads=2, reps=1, repack=False, out=tmp_path / "out", progress=False, rounds=2)
    assert not res["errors"], res["errors"]
    got = {(r["type"], r["test"], r["depth"]) for r in res["rows"]}
    assert got == {(t, x, d) for t in ("f16", "turbo3") for x in ("pp", "tg") for d in (0, 64)}
    assert all(r["tps"] > 0 and len(r["round_tps"]) == 2 for r in res["rows"])
    assert all(r["ratio_min"] <= r["ratio"] <= r["ratio_max"] for r in res["rows"] if r["type"] == "turbo3")
    assert sorted(r["round"] for r in res["round_rows"]) == [0] * 8 + [1] * 8
    assert len(res["raw"]["turbo3"]) == 8 and len(res["commands"]) == 4
    assert (tmp_path / "out" / "llama-bench-turbo3-r2.log").exists()
    saved = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert saved["model"]["random_weights"] and "RANDOM" in saved["warning"]
    assert "RANDOM" in (tmp_path / "out" / "bench.md").read_text()
    assert (tmp_path / "out" / "bench.png").stat().st_size > 0
