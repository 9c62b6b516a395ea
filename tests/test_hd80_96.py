"""Turbo caches on head_dim 80 (Phi-2, StableLM-3B, H2O-Danube) and 96 (Phi-3): the KV-cache patch stores each head
padded with zeros to 128 values, so the hd-128 blocks and kernels serve them.

The first tests use the bindings. No real hd-80/96 GGUF is reachable here, so the llama tests run small
llama-architecture models with RANDOM Q4_0 weights (turbo_llama.bench.shapes) made in the test: what they check are
properties (KLD finite and growing with the codebooks' error, the bytes, state files, context shift, the
refusals), never model quality."""
import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import turbo_llama as tl
from turbo_llama.eval.llama_tools import parse_perplexity
from _kv_helpers import complete, default_window_rows, first_divergence, request, server, tail, window_type

TYPES = ("turbo4", "turbo3", "turbo2")
# the d=128 codebooks' relative MSE (tests/test_format.py: Lloyd-Max for the coordinate law at d=128)
THEORY = {"turbo4": 0.009315, "turbo3": 0.0340, "turbo2": 0.116}


def relative_mse(x, y):
    return np.sum((x - y) ** 2, axis=-1) / np.sum(x.astype(np.float64) ** 2, axis=-1)


@pytest.mark.parametrize("hd", [80, 96])
@pytest.mark.parametrize("t", TYPES)
def test_padded_head_has_the_d128_distortion(hd, t):
    """A head of hd values padded with zeros to 128: the rotation spreads the error over all 128 coordinates, so the
    padded row has the d=128 codebook's relative MSE, and the real values carry hd/128 of it (the rest falls on the
    padding, which attention never reads): padded heads are quantized no worse than hd-128 heads."""
    x = np.random.default_rng(hd).standard_normal((20000, hd)).astype(np.float32)
    xp = np.pad(x, ((0, 0), (0, 128 - hd)))
    y = tl.dequantize(tl.quantize(xp, t), t)
    whole = float(np.mean(relative_mse(xp, y)))
    real = float(np.mean(relative_mse(x, y[:, :hd])))
    assert whole == pytest.approx(THEORY[t], rel=0.05), (whole, THEORY[t])
    assert real == pytest.approx(whole * hd / 128, rel=0.06), (real, whole)
    assert real < 0.8 * THEORY[t]


# ------------------------------------------------------------------------------------ llama, synthetic models
def shape(hd: int):
    from turbo_llama.bench.shapes import Shape
    # 8 query heads, 2 KV heads (GQA 4), two layers: Phi-2/Phi-3-like heads in a model that runs in seconds
    return Shape(f"hd{hd}", n_layer=2, n_embd=8 * hd, n_head=8, n_head_kv=2, head_dim=hd, n_ff=1024, n_vocab=512,
                 n_ctx_train=16384, rope_theta=10000.0, note=f"head_dim {hd} test model")


@pytest.fixture(scope="module")
def hd_model(tmp_path_factory):
    pytest.importorskip("gguf")
    from turbo_llama.bench.shapes import write_random_gguf
    d = tmp_path_factory.mktemp("hd-models")
    cache = {}

    def get(hd: int):
        if hd not in cache:
            cache[hd] = write_random_gguf(shape(hd), d / f"random-hd{hd}-q4_0.gguf", seed=hd)
        return cache[hd]
    return get


@pytest.fixture(scope="module")
def words_text(tmp_path_factory):
    """~20 KB of seeded words: the dummy vocabulary reads it byte by byte (~20K tokens)."""
    rng = np.random.default_rng(7)
    vocab = "the of and to in a is that for it as was with be by on not he this are or his from at which".split()
    text = " ".join(rng.choice(vocab, 4500))
    p = tmp_path_factory.mktemp("text") / "words.txt"
    p.write_text(text)
    return p


PADDED = re.compile(r"turbo caches: (\w+) ([KV]) head_dim (\d+) padded to 128 per head "
                    r"\(x([\d.]+) bytes, ([\d.]+) bits per value\)")


def perplexity(tool, model, text, ctk, ctv, base, tmp_path) -> tuple[dict, str]:
    """llama-perplexity, 4 chunks of 512, as `turbo-llama eval` runs it: the f16 pair writes the KLD base, the others
    compare with it. (Runs of half a second used to lose their last log lines at exit, 1 in ~10: the tools patch flushes
    the log before the tool returns, so a lost result here is a failure.)"""
    from turbo_llama.eval.perplexity import ppl_command, run_ppl
    cmd = ppl_command(tool, model, text, f"{ctk}/{ctv}", 512, 4, base, (ctk, ctv) == ("f16", "f16"), ["-t", "2"])
    log = tmp_path / f"{ctk}-{ctv}.log"
    r = run_ppl(cmd, log, f"{ctk}/{ctv}", timeout=600)
    need = "ppl" if (ctk, ctv) == ("f16", "f16") else "kld_mean"
    assert need in r, r
    return r, log.read_text(errors="replace")


MIXED = {80: [("f16", "turbo3"), ("turbo3", "f16")],     # q8_0 is refused at head_dim 80 (32-value blocks)
         96: [("q8_0", "turbo3"), ("turbo3", "q8_0")]}


@pytest.mark.slow
@pytest.mark.parametrize("hd", [80, 96])
def test_perplexity_kld_on_padded_heads(llama_tool, hd_model, words_text, tmp_path, hd, monkeypatch):
    """Every turbo type and the mixed pairs run; each turbo side logs its padding; KLD against the f16 cache is
    finite, positive and grows with the codebooks' distortion (turbo4 < turbo3 < turbo2, by about their MSE ratios);
    a pair with one turbo side sits below turbo2/turbo2, and turbo K alone below turbo3/turbo3. The turbo K probe
    runs on these models (its token buffer takes what their byte-level vocabulary needs: more tokens than characters),
    so the key offsets are subtracted before the padding. Without the recent window: at 512 tokens its 576 rows
    hold every cell, and every type would give q8_0's logits."""
    monkeypatch.setenv("TURBO_WINDOW", "0")
    tool = llama_tool("llama-perplexity")
    model, base = hd_model(hd), tmp_path / "base.kld"
    f16, _ = perplexity(tool, model, words_text, "f16", "f16", base, tmp_path)
    assert math.isfinite(f16["ppl"]), f16
    kld = {}
    for ctk, ctv in [(t, t) for t in TYPES] + MIXED[hd]:
        r, text = perplexity(tool, model, words_text, ctk, ctv, base, tmp_path)
        kld[ctk, ctv] = r["kld_mean"]
        print(f"hd {hd} {ctk}/{ctv}: KLD {r['kld_mean']:.6f} PPL {r['ppl']:.3f} (f16 {f16['ppl']:.3f}) "
              f"same top {r.get('same_top', math.nan):.2f}%")
        assert math.isfinite(r["kld_mean"]) and r["kld_mean"] > 0 and math.isfinite(r["ppl"]), r
        padded = {(m.group(1), m.group(2), int(m.group(3))) for m in PADDED.finditer(text)}
        want = {(t, side, hd) for t, side in ((ctk, "K"), (ctv, "V")) if t.startswith("turbo")}
        assert padded == want, (padded, want)
        if ctk.startswith("turbo"):   # the probe ran: offsets on both layers
            assert re.search(r"turbo K: key offsets from a \d+-token probe on 2 layers", text), text[-3000:]
    k4, k3, k2 = (kld[t, t] for t in TYPES)
    # at these small errors KLD follows the codebooks' MSE (x3.6 from turbo4 to turbo3, x3.4 to turbo2; measured
    # x2.6 and x3.0): a padding that misaligns q, k or the V slice gives every type the KLD of a wrong attention
    # output instead (tried once, the V slice 8 values off: 0.00337 / 0.00337 / 0.00338 at head_dim 80)
    assert 1.5 < k3 / k4 < 6 and 1.5 < k2 / k3 < 6, kld
    for ctk, ctv in MIXED[hd]:
        assert kld[ctk, ctv] < kld["turbo2", "turbo2"], kld
        if ctk == "turbo3":
            assert kld[ctk, ctv] < kld["turbo3", "turbo3"], kld


def completion(llama_tool, model, ctk, ctv, log, ctx=16384):
    """(exit code, log): two tokens after a short prompt, the log in a file (as in perplexity())."""
    cmd = [str(llama_tool("llama-completion")), "-m", str(model), "-p", "the of and", "-n", "2", "-c", str(ctx),
           "-ctk", ctk, "-ctv", ctv, "-fa", "on", "-t", "2", "--temp", "0", "-no-cnv", "--no-warmup", "-lv", "4"]
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=600).returncode
    return rc, Path(log).read_text(errors="replace")


TYPE_SIZE = {"turbo4": 66, "turbo3": 50, "turbo2": 34}


@pytest.mark.slow
@pytest.mark.parametrize("hd", [80, 96])
@pytest.mark.parametrize("ctk,ctv", [("turbo3", "turbo3"), ("turbo2", "turbo4"), ("f16", "turbo3")])
def test_cache_bytes_are_the_padded_heads(llama_tool, hd_model, tmp_path, hd, ctk, ctv):
    """llama's cache size is the true one: a turbo head costs what an hd-128 head does (one block), an f16 head its
    real hd values; the log names the factor and the bits per real value (bits x 128/hd). The recent window's rows
    count too: a turbo side's q8_0 of the stored (padded) head, an f16 side's own rows."""
    rc, out = completion(llama_tool, hd_model(hd), ctk, ctv, tmp_path / "c.log")
    assert rc == 0, out[-3000:]
    kv = parse_perplexity(out)["kv"]
    s = shape(hd)
    slots = s.n_layer * 16384 * s.n_head_kv            # cells x layers x KV heads
    window = kv["caches"][0]["window"]
    rows = default_window_rows(16384, 16384)
    assert window == dict(rows=rows, type_k=window_type(ctk), type_v=window_type(ctv)) and rows == 576, kv

    def mib(t, side):
        per_head = TYPE_SIZE[t] if t in TYPE_SIZE else 2 * hd
        # a turbo cache's side tensors (the KV-cache patch), f32 per layer: K's offset (real heads), q/k gains and
        # cell 0's exact row (stored heads), V's cell-0 row (stored heads)
        extra = 0
        if t in TYPE_SIZE:
            extra = 4 * s.n_layer * (s.n_head_kv * hd + 2 * hd + s.n_head_kv * 128 if side == "K" else s.n_head_kv * 128)
        ring_head = 128 * 34 // 32 if t in TYPE_SIZE else 2 * hd
        extra += s.n_layer * window["rows"] * s.n_head_kv * ring_head
        return (slots * per_head + extra) / 2**20
    assert kv["k_mib"] == pytest.approx(mib(ctk, "K"), abs=0.006), kv
    assert kv["v_mib"] == pytest.approx(mib(ctv, "V"), abs=0.006), kv
    sides = [m.group(2) for m in PADDED.finditer(out)]
    assert sides == [side for t, side in ((ctk, "K"), (ctv, "V")) if t in TYPE_SIZE], sides
    for m in PADDED.finditer(out):
        t = m.group(1)
        assert float(m.group(4)) == pytest.approx(128 / hd, abs=0.005)
        assert float(m.group(5)) == pytest.approx(TYPE_SIZE[t] * 8 / hd, abs=0.005)


@pytest.mark.slow
@pytest.mark.parametrize("hd", [48, 160])
def test_other_head_sizes_are_refused(llama_tool, hd_model, tmp_path, hd):
    """Padding is for heads of 65 to 127 values: 48 would cost x2.7 (turbo3 at 8.3 bits/value, no smaller than
    q8_0), 160 is neither a 64-multiple nor padded. The message names the head size and the way out; f16 runs."""
    model = hd_model(hd)
    rc, out = completion(llama_tool, model, "turbo3", "turbo3", tmp_path / "t.log", ctx=512)
    assert rc != 0
    assert re.search(rf"the turbo3 K cache stores whole blocks of 128 values per head .*heads of 65 to 127 values "
                     rf"padded to 128\), but this model has head_dim {hd} \(layer 0\); use f16, q8_0 or q4_0 for -ctk",
                     out), out[-3000:]
    rc, out = completion(llama_tool, model, "f16", "f16", tmp_path / "f.log", ctx=512)
    assert rc == 0, out[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("ctk,ctv", [("turbo3", "turbo3"), ("f16", "turbo2")])
def test_slot_save_restore_padded(llama_tool, hd_model, tmp_path, ctk, ctv):
    """A slot saved from a padded cache restores into a fresh process and continues with the same greedy tokens as
    the uninterrupted one (the state's rows are the cache's padded rows)."""
    exe, model = llama_tool("llama-server"), hd_model(80)
    saves = tmp_path / "slots"
    saves.mkdir()
    args = ["-np", "1", "--slot-save-path", str(saves)]
    prompt = [1] + list(range(300, 340))
    with server(exe, model, tmp_path / "a.log", ctk, ctv, extra=args) as srv:
        first = complete(srv, prompt, 8)["tokens"]
        code, saved = request(srv, "/slots/0?action=save", {"filename": "s.bin"})
        assert code == 200, saved
        uninterrupted = complete(srv, prompt + first, 8)
    with server(exe, model, tmp_path / "b.log", ctk, ctv, extra=args) as srv:
        code, restored = request(srv, "/slots/0?action=restore", {"filename": "s.bin"})
        assert code == 200, f"{restored}\n{tail(tmp_path / 'b.log')}"
        resumed = complete(srv, prompt + first, 8)
    assert resumed["timings"]["prompt_n"] <= 2, resumed["timings"]
    assert resumed["tokens"] == uninterrupted["tokens"], first_divergence(resumed["tokens"], uninterrupted["tokens"])


@pytest.mark.slow
@pytest.mark.parametrize("ctk,ctv", [("turbo3", "turbo3"), ("q8_0", "turbo3")])
def test_context_shift_on_padded_heads(llama_tool, hd_model, tmp_path, ctk, ctv):
    """K-shift re-ropes a padded turbo K over whole stored heads (its blocks decode only whole): the server shifts
    a 256-cell context at least twice and generates every token asked for."""
    log = tmp_path / "s.log"
    extra = ["-np", "1", "--context-shift", "--cache-ram", "0"]
    with server(llama_tool("llama-server"), hd_model(96), log, ctk, ctv, ctx=256, extra=extra) as srv:
        r = complete(srv, [1] + list(range(300, 460)), 140, ignore_eos=True, n_keep=0, n_discard=32)
    assert tail(log, 1_000_000).count("slot context shift") >= 2, tail(log)
    assert r["timings"]["predicted_n"] == 140 and r["truncated"]
