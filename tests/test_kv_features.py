"""Issue #7, llama side: features that move the KV cache around keep working with turbo caches,
or refuse clearly; none may corrupt a conversation silently. All on the real default model
(Gemma 3 270M), CPU, greedy, 2 threads, small contexts. With TURBO_LLAMA_NGL > 0 (tests/conftest.py) the
same tests run offloaded to a GPU (ci/gpu-kv.sh), where they are recorded.

- sequence state save/restore through llama-server's slot files, into a fresh server process
- parallel slots: isolation, and sanity under concurrent load (compared with f16)
- context shift (K-shift re-ropes quantized K) and server cache reuse
- RPC: ggml-rpc-server carries the turbo types
- --prompt-cache files: load back; a file of another cache type is refused
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest

from _kv_helpers import (GPU, OFFLOAD, ServerDied, complete, concurrently, first_divergence, link_llama_program,
                         readability, request, rpc_server, run, server, tail)

pytestmark = pytest.mark.slow

N = 16  # tokens per answer: enough to see a departure, cheap on 2 cores

CONVERSATION = ("A short conversation.\nTom: I am planning a trip to the mountains next week. "
                "What should I pack?\nAnna:")


@pytest.fixture(scope="module")
def srv_exe(llama_tool):
    return llama_tool("llama-server")


def tokens_of(srv, text: str) -> list[int]:
    """The prompt as the server would process it (BOS included), so requests can send token ids."""
    return srv.post("/tokenize", {"content": text, "add_special": True})["tokens"]


# ----------------------------------------------------------------- 1. sequence state save/restore
# Gemma 3 has sliding-window layers: without --swa-full llama-server keeps a cached prefix only through
# its in-memory context checkpoints, which a slot file does not carry, so a restored slot (any cache
# type, f16 too) is re-processed from scratch. With --swa-full the restored cells are used as they are.
SWA_FULL = ["--swa-full"]

@pytest.mark.parametrize("ctk, ctv", [("turbo3", "turbo3"), ("turbo2", "turbo2"), ("q8_0", "turbo3")])
def test_slot_save_restore_continues_exactly(srv_exe, model_path, tmp_path, ctk, ctv):
    """Save slot 0 after a first answer; continue (a) in the same process, (b) in a fresh process
    after restoring the slot file: the same greedy tokens, and (b) really used the restored cache."""
    saves = tmp_path / "slots"
    saves.mkdir()
    args = ["-np", "1", "--slot-save-path", str(saves), *SWA_FULL]
    with server(srv_exe, model_path, tmp_path / "a.log", ctk, ctv, extra=args) as srv:
        prompt = tokens_of(srv, CONVERSATION)
        first = complete(srv, prompt, N)["tokens"]
        assert len(first) == N
        code, saved = request(srv, "/slots/0?action=save", {"filename": "conv.bin"})
        assert code == 200, saved
        assert saved["n_saved"] >= len(prompt) + N - 1, saved
        uninterrupted = complete(srv, prompt + first, N)
    assert (saves / "conv.bin").stat().st_size == saved["n_written"]

    with server(srv_exe, model_path, tmp_path / "b.log", ctk, ctv, extra=args) as srv:
        code, restored = request(srv, "/slots/0?action=restore", {"filename": "conv.bin"})
        assert code == 200, f"{restored}\n{tail(tmp_path / 'b.log')}"
        assert restored["n_restored"] == saved["n_saved"]
        resumed = complete(srv, prompt + first, N)
    # the fresh process evaluated only the tail: the rest came from the restored slot
    assert resumed["timings"]["prompt_n"] <= 2, resumed["timings"]
    assert uninterrupted["timings"]["prompt_n"] <= 2, uninterrupted["timings"]
    assert resumed["tokens"] == uninterrupted["tokens"], (
        f"{ctk}/{ctv}: restored conversation departs at token "
        f"{first_divergence(resumed['tokens'], uninterrupted['tokens'])}: "
        f"{resumed['content']!r} vs {uninterrupted['content']!r}")


def test_slot_file_of_another_cache_type_is_refused(srv_exe, model_path, tmp_path):
    saves = tmp_path / "slots"
    saves.mkdir()
    args = ["-np", "1", "--slot-save-path", str(saves)]
    with server(srv_exe, model_path, tmp_path / "a.log", "turbo3", "turbo3", extra=args) as srv:
        complete(srv, CONVERSATION, 4)
        code, saved = request(srv, "/slots/0?action=save", {"filename": "t3.bin"})
        assert code == 200, saved
    for ctk, ctv, what in [("turbo2", "turbo2", "key"), ("turbo3", "q8_0", "value")]:
        log = tmp_path / f"{ctk}-{ctv}.log"
        with server(srv_exe, model_path, log, ctk, ctv, extra=args) as srv:
            code, body = request(srv, "/slots/0?action=restore", {"filename": "t3.bin"})
            after = complete(srv, CONVERSATION, 4)
            n_prompt = len(tokens_of(srv, CONVERSATION))
        # the user's message (HTTP 400) ...
        assert code == 400, body
        assert body["error"]["message"] == ("Unable to restore slot: No available space in KV cache or "
                                            "invalid slot save file"), body
        # ... and the server log names the cause (read after the server stopped: its log is async)
        assert re.search(rf"mismatched {what} type \(\d+ != \d+, layer \d+\)", tail(log, 1_000_000)), tail(log)
        # the slot was left empty and usable: the next prompt is processed from scratch
        assert after["timings"]["prompt_n"] == n_prompt, after["timings"]


# ----------------------------------------------------------------------------- 2. parallel slots
OTHERS = ["The recipe for a simple tomato soup starts with",
          "In the year 1850 the small harbour town",
          "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"]


@pytest.mark.parametrize("unified", [False, True], ids=["per-slot-kv", "kv-unified"])
def test_parallel_slots_are_isolated(srv_exe, model_path, tmp_path, unified):
    extra = ["-np", "4", "--kv-unified" if unified else "--no-kv-unified", *SWA_FULL]
    with server(srv_exe, model_path, tmp_path / "s.log", "turbo3", "turbo3", ctx=4 * 512, extra=extra) as srv:
        fresh = complete(srv, CONVERSATION, N, id_slot=0, cache_prompt=False)["tokens"]
        cached = complete(srv, CONVERSATION, N, id_slot=0, cache_prompt=True)  # slot 0's own cells
        assert cached["timings"]["prompt_n"] <= 2
        # three other conversations held by slots 1..3, at the same time
        concurrently([lambda i=i, p=p: complete(srv, p, 2 * N, id_slot=i) for i, p in enumerate(OTHERS, 1)])
        # any slot: the server finds the cached conversation itself. With a per-slot KV cache that is
        # slot 0's own cells; with a unified one, idle slots were saved to the RAM prompt cache and
        # cleared when the others started, so it comes back from there (llama_state_seq_set_data)
        cached_after = complete(srv, CONVERSATION, N, cache_prompt=True)
        fresh_after = complete(srv, CONVERSATION, N, id_slot=0, cache_prompt=False)["tokens"]
    print(f"unified={unified}: prompt_n cached {cached['timings']['prompt_n']}, after {cached_after['timings']['prompt_n']}; "
          f"first departure {first_divergence(cached_after['tokens'], cached['tokens'])}: {cached_after['content']!r} vs {cached['content']!r}")
    assert fresh_after == fresh
    assert cached_after["timings"]["prompt_n"] <= 2  # the cached cells were used ...
    if not unified:
        assert cached_after["tokens"] == cached["tokens"]  # ... and the other slots did not touch them
    else:
        # restored into other cells of the shared buffer: attention sums them in another order, so the
        # greedy text may depart anywhere; where is luck, not isolation (measured on one build: at token 16
        # of 16 with the plain C K dot, at token 2 with the AVX2 one; at token 8 on an earlier build). What
        # isolation means here: nothing of the other slots' conversations enters slot 0's answer.
        leaked = [w for w in ("tomato", "soup", "recipe", "harbour", "1850", "fibonacci", "def ")
                  if w in cached_after["content"].lower() and w not in cached["content"].lower()]
        assert not leaked, (leaked, cached_after["content"])
        q = readability(cached_after["content"])
        assert q["alpha_frac"] >= 0.8 and q["longest_junk"] <= 8, (q, cached_after["content"])


PAIRS = [("The capital of Italy is Rome, and the capital of Spain is", "My favourite colour is blue because"),
         ("Water boils at a temperature of", "The first man to walk on the moon was"),
         ("Once upon a time, in a small village,", "To install the package, run the command"),
         ("The three primary colours are", "def add(a, b):\n    return"),
         ("Photosynthesis is the process by which", "The best way to learn a language is"),
         ("Q: What is 12 times 12?\nA:", "The river Nile flows through"),
         ("Dear Sir or Madam, I am writing to", "The largest planet in the solar system is"),
         ("Shakespeare wrote many plays, including", "A healthy breakfast usually contains")]


def departures(srv_exe, model_path, log, ctk, ctv) -> list[int]:
    """For each prompt of each pair: the first token where its answer beside the other prompt
    (both in flight at once) departs from its answer alone (N = no departure)."""
    with server(srv_exe, model_path, log, ctk, ctv, ctx=4 * 512, extra=["-np", "4"]) as srv:
        solo = {p: complete(srv, p, N, cache_prompt=False)["tokens"] for pair in PAIRS for p in pair}
        out = []
        for a, b in PAIRS:
            ra, rb = concurrently([lambda: complete(srv, a, N, id_slot=0, cache_prompt=False),
                                   lambda: complete(srv, b, N, id_slot=1, cache_prompt=False)])
            out += [first_divergence(solo[a], ra["tokens"]), first_divergence(solo[b], rb["tokens"])]
    return out


# Issue #7: under concurrent load greedy answers depart from their solo answers (upstream's arithmetic depends on the
# batching). With turbo keys in every layer turbo3 departed sooner than f16: token 8.31 against 14.75 on average.
# Since the KV-cache patch keeps Gemma 3's window layers' keys in q8_0 the two are within this test's noise: two runs on
# 2026-12-02 gave turbo3 11.62 / f16 12.94, 14.12 / 11.62 and 12.50 / 12.12 (a mean over 16 prompts moves ~1.5 tokens
# between runs, the difference ~2). The bound, 5 tokens, catches a return to the old gap (6.4) and leaves the noise.
DEPARTURE_MARGIN = 5


def test_concurrent_answers_depart_about_as_late_as_f16(srv_exe, model_path, tmp_path):
    f16 = departures(srv_exe, model_path, tmp_path / "f16.log", "f16", "f16")
    t3 = departures(srv_exe, model_path, tmp_path / "t3.log", "turbo3", "turbo3")
    print(f"first departure (of {N}) f16: {f16} mean {statistics.mean(f16):.2f}; "
          f"turbo3: {t3} mean {statistics.mean(t3):.2f}")
    assert statistics.mean(t3) >= statistics.mean(f16) - DEPARTURE_MARGIN, (f16, t3)


# ------------------------------------------------------------------ 3. context shift, cache reuse
# K-shift (context shift, cache reuse) re-ropes cached K: for a quantized K, llama_kv_cache::build_rope_shift
# dequantizes, ropes and requantizes. Upstream also undid/redid its Hadamard rotation there with a null
# matrix when attn_rot_k = 0 (always for turbo K) and crashed; the KV-cache patch guards it.
# turbo V is never shifted: works with any K
SHIFT_PAIRS = [("turbo3", "turbo3"), ("turbo2", "turbo2"), ("q8_0", "turbo3"), ("q8_0", "turbo2")]

STORY = ("Chapter one. The old lighthouse keeper climbed the stairs every evening and lit the great lamp. "
         "From the gallery he could see the whole bay: the fishing boats coming home, the gulls over the "
         "harbour wall, the church tower and the road that wound up the hill to the village. His daughter "
         "Mary brought him bread and soup at nine, and they talked about the ships, the weather and the "
         "letters from her brother, who had gone to sea two years before. In the winter the storms came "
         "in from the west, and the keeper wrote down every ship that passed in a thick book with a green "
         "cover. Mary read the book in the afternoons and learned the names of the ships by heart: the "
         "Swallow, the Northern Star, the Good Hope. One stormy night in November,")


@pytest.mark.parametrize("ctk, ctv", SHIFT_PAIRS)
def test_context_shift_stays_readable(srv_exe, model_path, tmp_path, ctk, ctv):
    """A 256-token context and n_predict beyond it: the server shifts the context (K-shift) at least
    twice; the text after the shifts stays readable English (words, no symbol runs)."""
    log = tmp_path / "s.log"
    extra = ["-np", "1", "--context-shift", "--cache-ram", "0"]
    n = 136  # prompt ~157 tokens: shifts (32 tokens each) after ~98 and ~130 generated tokens
    with server(srv_exe, model_path, log, ctk, ctv, ctx=256, extra=extra) as srv:
        n_prompt = len(tokens_of(srv, STORY))
        r = complete(srv, STORY, n, ignore_eos=True, n_keep=0, n_discard=32)
    text = tail(log, 1_000_000)
    shifts = text.count("slot context shift")
    assert 140 < n_prompt < 180 and shifts >= 2 and r["truncated"], (n_prompt, shifts, text[-2000:])
    assert r["timings"]["predicted_n"] == n
    after = r["content"][len(r["content"]) * 2 // 5:]  # what was generated after the first shift
    q = readability(after)
    print(f"{ctk}/{ctv}: {shifts} shifts, {q}: {r['content']!r}")
    # (a greedy 270M base model may loop on one sentence, as f16 does: that is not garbage)
    assert q["n_words"] >= 20 and q["alpha_frac"] >= 0.8, (q, after)
    assert q["longest_junk"] <= 12, (q, after)


BODY = (" The committee met on Tuesday to discuss the new library. The architect presented three "
        "designs: a glass tower, a low brick building around a courtyard, and a converted railway "
        "station. Most members liked the courtyard, because it would keep the reading rooms quiet "
        "and give children a safe place to play. The treasurer warned that the budget allowed only "
        "one of the three designs, and that the railway station would need a new roof. After a long "
        "debate the committee voted, and the result was announced the next morning. The winner was")
HEADER = ("Minutes of the town council of Millbrook, taken by the clerk, with a list of everyone who "
          "attended the meeting.")


# Measured 2026-11-29 (CPU, Gemma 3 270M): after the null-rotation fix in the KV-cache patch the shift runs,
# but a shifted turbo K is dequantized, re-roped and quantized a second time. Before the key transform
# (turbo K gain rescale and key offset; the shift adds the offset back around the RoPE) turbo3 lost the
# fact (" the committee voted. The winner was the committee."); with them turbo3 answers " the low brick
# building." (a design from the text). turbo2 K still loses it. Measured 2026-11-30: so does turbo2 without
# any shift when the server processes the body again behind a cached BOS (cache reuse off: " the low-cost,
# low-cost design."), while the body sent with cache_prompt=false keeps it: on this model the 2-bit cache
# holds this fact at the edge of its own noise, and one question cannot separate the shift from that.
# Measured 2026-12-07: with the recent window (#51; the body's shifted cells read from their codes, the answer's
# from the window) turbo2 answers " the glass tower.": the xfail of issue #8 is gone.
REUSE_PAIRS = [("turbo3", "turbo3"), ("turbo2", "turbo2"), ("q8_0", "turbo3"), ("q8_0", "turbo2")]


@pytest.mark.parametrize("ctk, ctv", REUSE_PAIRS)
def test_cache_reuse_shifts_a_kept_chunk(srv_exe, model_path, tmp_path, ctk, ctv):
    """--cache-reuse 64: the client drops the header of the previous prompt and keeps the long body; the
    server moves the body's cached KV 25 positions back (K-shift) instead of recomputing it, and the
    answer is still a sensible one (the committee chose one of the three designs)."""
    log = tmp_path / "s.log"
    # --cache-ram 0: otherwise the server parks the slot in its RAM cache and clears it on a
    # low-similarity prompt, and there is nothing left to reuse (upstream behaviour, any cache type)
    extra = ["-np", "1", "--cache-reuse", "64", "--cache-ram", "0", *SWA_FULL]
    with server(srv_exe, model_path, log, ctk, ctv, extra=extra) as srv:
        full, header = tokens_of(srv, HEADER + BODY), tokens_of(srv, HEADER)
        assert full[:len(header)] == header
        kept = full[:1] + full[len(header):]  # BOS + body
        complete(srv, full, 4)
        reused = complete(srv, kept, N)
        scratch = complete(srv, kept, N, cache_prompt=False)
    text = tail(log, 1_000_000)
    assert "cache reuse is not supported" not in text
    assert reused["timings"]["prompt_n"] <= 2, reused["timings"]  # the body came from the shifted cache
    print(f"{ctk}/{ctv} reused: {reused['content']!r}; from scratch: {scratch['content']!r}")
    q = readability(reused["content"])
    assert q["alpha_frac"] >= 0.7 and q["longest_junk"] <= 8, (q, reused["content"])
    assert re.search(r"glass|brick|courtyard|railway|station", reused["content"].split(".")[0]), reused["content"]



# K-shift quality, measured as likelihood: tests/c/kshift_nll.cpp, a small program on the public llama.h API,
# linked against the CPU build's static libraries. Per window of the jargon text (BOS + 255 prefix tokens,
# 128 continuation tokens teacher-forced, 8 windows = 1024 scored tokens; flash attention, swa_full, 2 threads):
#   ref      prefix at positions 0..255, continuation at 256..383
#   shifted  prefix at 96..351, llama_memory_seq_add(-96) (the next decode runs the K-shift: dequantize, RoPE,
#            requantize), continuation at 256..383
#   control  prefix at 96..351, continuation at 352..479, no shift: the same relative positions; it differs
#            from ref only by numerics (f16) or by another draw of the quantization noise (turbo)
# and a second context with an f16 cache gives the f16 reference. KLD = mean KL(f16 ref || run), nats/token,
# full vocabulary. The cached prefix keys themselves are read back (llama_state_seq_get_data) and compared
# with the ones a fresh prefill at 0.. caches: rel_err = |K_shifted - K_ref| / |K_ref| over all layers;
# u = the cache type's own round-trip error on Gaussian rows (turbo3 0.184, turbo2 0.345, f16 0.0002).
#
# Measured 2026-11-30 on this project's 2-core CPU machine (Gemma 3 270M Q4_K_M; f16-cache NLL 3.7023):
#   K/V            NLL ref  shifted  control | KLD ref  shifted  control | top-1 shifted control | keys rel_err (/u)
#   f16/f16        3.7023   3.6985   3.6945  | 0        0.0069   0.0071  | 0.952   0.946         | 0.030
#   q8_0/q8_0      3.6984   3.6988   3.7009  | 0.0081   0.0083   0.0082  | 0.944   0.953         | 0.035
#   turbo3/turbo3  3.8216   3.8167   3.8105  | 0.1434   0.1450   0.1377  | 0.771   0.814         | 0.373 (2.02 u)
#   turbo2/turbo2  4.1657   4.2469   4.2015  | 0.5275   0.5700   0.5702  | 0.606   0.610         | 0.655 (1.90 u)
#   q8_0/turbo3    3.7254   3.7381   3.7244  | 0.0382   0.0378   0.0375  | 0.898   0.900         | 0.076
# With other shift distances (S = 32/64/128, same windows) shifted/control KLD is 0.97..1.05 for turbo3 and
# 1.00..1.11 for turbo2 (turbo2 at S=32: 0.598 vs 0.537, the largest); control/ref KLD spans 0.94..1.11. So
# the shift's own extra loss is within the spread of the unshifted cache's own noise draws: a few % of the
# type's own KLD against f16 (turbo3 0.14, turbo2 0.53 nats/token). turbo2's fact-question xfail above was
# its own noise (top-1 agreement with f16 only ~61%, shifted or not), not the shift.
#
# Bounds (deterministic here; the margins are for other CPUs' rounding and other draws):
#   KLD(shifted) <= 1.25 x KLD(control)   measured <= 1.05 (<= 1.11 over the S sweep)
#   NLL(shifted) <= 1.03 x NLL(control)   measured <= 1.011 (<= 1.012 over the S sweep)
#   rel_err <= hypot(2.25 u, 0.05)        one quantization in ref, two in shifted, and the prefix computed
#                                         under another noise draw (about one more u): sqrt(4) u = 2 u
#                                         expected; 0.05 is the f16 floor (the prefix's own numeric drift)
# A broken shift, measured with a patched copy of llama-kv-cache.cpp linked into the program (not in CI);
# KLD shifted/control and key error, turbo3 | turbo2 (every one caught unless marked):
#   key offset neither added before the RoPE nor subtracted after   x1.37, 2.50 u | x1.11, 2.06 u (not caught:
#                                                                    inside turbo2's noise; same code as turbo3)
#   subtracted after, not added before                              x31,   5.63 u | x7.5,  3.46 u
#   added before, not subtracted after                              x7.7,  5.62 u | x2.4,  3.44 u
#   RoPE mode NORM instead of NEOX                                  x17.6, 7.37 u | x4.7,  4.10 u
#   freq base 1e6 on the local layers too                           x13.1, 4.79 u | x3.5,  2.90 u
# A wrong shift amount (seq_add delta -96+1 or -96+7, continuation at 257.. or 263..) costs no likelihood on
# this model (f16: KLD 0.0069 as for the right amount, 0.0065 with a 200-position gap (4 windows); turbo3 x1.02, x1.15):
# Gemma 3 barely cares how far back the prefix sits. Only the key check sees it: f16 0.090 and 0.237
# (bound 0.050), turbo3 2.37 u and 3.71 u, turbo2 2.01 u (not caught) and 2.48 u.
# With the recent window (on by default) the shift also turns the window's K rows (q8_0: a turbo K's in the rotated
# domain, q8_0/turbo3's as the cells). At these sizes the window (64 + n_ubatch rows) holds every cell, so a run with
# it tests the rows' turn and TURBO_WINDOW=0 the cells' own requantization. Measured 2026-12-07 (same machine):
#   K/V (window)       KLD ref  shifted  control
#   turbo3/turbo3      0.0072   0.0072   0.0073     (a first version that dropped the moved cells' rows: 0.0309)
#   q8_0/turbo3        0.0080   0.0079   0.0078
#   turbo3/turbo3 (0)  0.1229   0.1231   0.1265
KSHIFT_CASES = [("f16", "f16", None), ("turbo3", "turbo3", None), ("q8_0", "turbo3", None), ("turbo3", "turbo3", "0"),
                ("turbo2", "turbo2", "0")]
KSHIFT_ARGS = ["windows=8", "prefix=256", "cont=128", "start=96", "threads=2"]


@pytest.fixture(scope="module")
def kshift_nll(llama_tool, tmp_path_factory):
    """tests/c/kshift_nll.cpp linked against the built static libraries (as ggml_roundtrip in
    tests/test_llama_cpu.py): the llama.cpp that is in the tools."""
    if GPU or os.environ.get("TURBO_LLAMA_BIN_DIR"):
        pytest.skip("a CPU measurement: it links the CPU build's static libraries")
    return link_llama_program(Path(__file__).parent / "c" / "kshift_nll.cpp",
                              tmp_path_factory.mktemp("kshift") / "kshift_nll", llama_tool)


@pytest.mark.parametrize("ctk, ctv, window", KSHIFT_CASES)
def test_kshift_keeps_likelihood(kshift_nll, model_path, jargon_path, ctk, ctv, window):
    """A K-shifted cache predicts the continuation as well as the same cache unshifted (KLD against f16
    and NLL, shifted vs control), and its re-roped keys sit where a fresh prefill puts them, up to the
    requantization noise. f16 is the exactness control. Values and bounds: the comment above."""
    # the KV-cache patch's shift turns cell 0's exact rows too: measured 2026-12-02 (AMD 2-core machine), turbo3 KLD
    # shifted 0.1271 against control 0.1185 (x1.07); a first version that dropped them on a shift gave 0.1434 (x1.21)
    env = {k: v for k, v in os.environ.items() if k != "TURBO_WINDOW"}   # None: the default window
    if window is not None:
        env["TURBO_WINDOW"] = window
    out = subprocess.run([str(kshift_nll), str(model_path), str(jargon_path), ctk, ctv, *KSHIFT_ARGS],
                         capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    r = json.loads(out.stdout.split("RESULT ", 1)[1])
    kld, nll, keys = r["kld"], r["nll"], r["keys"]
    print(f"{ctk}/{ctv}: {json.dumps(r)}")
    assert r["tokens"] == 1024 and keys["positions_ok"], r
    # the shift ran: the shifted run is not the control run (it would be with a no-op seq_add)
    assert nll["shifted"] != nll["control"], r
    assert kld["shifted_vs_f16"] <= 1.25 * kld["control_vs_f16"], (
        f"{ctk}/{ctv}: the K-shift costs likelihood: KLD vs f16 {kld['shifted_vs_f16']:.4f} shifted, "
        f"{kld['control_vs_f16']:.4f} unshifted at the same positions ({kld['ref_vs_f16']:.4f} at 0..)")
    assert nll["shifted"] <= 1.03 * nll["control"], nll
    bound = math.hypot(2.25 * keys["type_noise"], 0.05)
    assert keys["rel_err"] <= bound, (
        f"{ctk}/{ctv}: the shifted keys are {keys['rel_err']:.4f} (relative) from a fresh prefill's, "
        f"more than {bound:.4f} (the type's own noise {keys['type_noise']:.4f})")

# -------------------------------------------------------------------------------------- 4. RPC
RPC_PROMPT = "The history of the printing press begins in"


def completion_cmd(exe, model, ctk, ctv, prompt, n, *extra):
    return [exe, "-m", model, "-p", prompt, "-n", str(n), "-c", "1024", "-ctk", ctk, "-ctv", ctv,
            "-fa", "on", "--temp", "0", "--top-k", "1", "--seed", "1", "-no-cnv", "--no-warmup",
            "-t", "2", *OFFLOAD, *extra]


def ppl(exe, model, text_file, ctk, ctv, *extra) -> float:
    out = run([exe, "-m", model, "-f", text_file, "-c", "512", "--chunks", "2", "-ctk", ctk, "-ctv", ctv,
               "-fa", "on", "-t", "2", *OFFLOAD, *extra], timeout=900)
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", out.stdout + out.stderr)
    assert out.returncode == 0 and m, (out.stdout + out.stderr)[-3000:]
    return float(m.group(1))


def test_rpc_carries_turbo_caches(llama_tool, model_path, jargon_path, tmp_path):
    """The model and the turbo3 KV cache on a ggml-rpc-server (CPU) give what a local CPU run gives.
    The RPC server's CPU backend holds the weights unrepacked, so the local run uses -nr (--no-repack)
    for the same arithmetic: with repacked Q4_K matmuls the greedy text departs after a few tokens for
    every cache type (f16 too), and turbo3's perplexity moves by ~7% (f16: 0.07%).
    GPU run: the RPC server serves the GPU, the local run is on that GPU (-ngl, no -nr), and the client
    is pinned to the RPC device (-dev RPC0, after --rpc registers it), else it splits the layers
    between its own GPU and the RPC one."""
    exe = llama_tool("llama-completion")
    local_args = [] if GPU else ["-nr"]
    to_rpc = ["-dev", "RPC0"] if GPU else []
    local = run(completion_cmd(exe, model_path, "turbo3", "turbo3", RPC_PROMPT, 32, *local_args))
    assert local.returncode == 0, local.stderr[-3000:]
    with rpc_server(llama_tool("ggml-rpc-server"), tmp_path / "rpc.log") as addr:
        remote = run(completion_cmd(exe, model_path, "turbo3", "turbo3", RPC_PROMPT, 32,
                                    "--rpc", addr, *to_rpc, "-ngl", "99", "-lv", "4"))
        assert remote.returncode == 0, remote.stderr[-3000:] + tail(tmp_path / "rpc.log")
        # the layers and the turbo KV cache really live on the RPC device
        assert "offloaded 19/19 layers to GPU" in remote.stderr, remote.stderr[-3000:]
        assert re.search(r"llama_kv_cache: RPC0\[127\.0\.0\.1:\d+\] KV buffer size", remote.stderr), remote.stderr[-3000:]
        assert re.search(r"K \(turbo3\).*V \(turbo3\)", remote.stderr)
        gen = lambda out: out.stdout.split(RPC_PROMPT, 1)[-1]
        if gen(remote) == gen(local):
            return
        # the split changed the arithmetic: then the same perplexity within 0.1%
        p_remote = ppl(llama_tool("llama-perplexity"), model_path, jargon_path, "turbo3", "turbo3",
                       "--rpc", addr, *to_rpc, "-ngl", "99")
    p_local = ppl(llama_tool("llama-perplexity"), model_path, jargon_path, "turbo3", "turbo3", *local_args)
    assert abs(p_remote - p_local) <= 0.001 * p_local, (
        f"RPC text {gen(remote)!r} != local {gen(local)!r}, and PPL {p_remote} vs {p_local}")


# ---------------------------------------------------------------------------- 5. prompt-cache files
def test_prompt_cache_file_with_turbo_loads_back(llama_tool, model_path, tmp_path):
    exe, cache = llama_tool("llama-completion"), tmp_path / "prompt.cache"
    first = run(completion_cmd(exe, model_path, "turbo3", "turbo3", RPC_PROMPT, 16, "--prompt-cache", cache))
    assert first.returncode == 0, first.stderr[-3000:]
    assert "session file does not exist, will create" in first.stderr
    assert cache.stat().st_size > 0
    second = run(completion_cmd(exe, model_path, "turbo3", "turbo3", RPC_PROMPT, 16, "--prompt-cache", cache))
    assert second.returncode == 0, second.stderr[-3000:]
    assert re.search(r"loaded a session with prompt size of \d+ tokens", second.stderr), second.stderr[-3000:]
    assert "session file has exact match for prompt" in second.stderr
    gen = lambda out: out.stdout.split(RPC_PROMPT, 1)[-1]
    assert gen(second) == gen(first), (gen(first), gen(second))


@pytest.fixture(scope="module")
def turbo3_prompt_cache(llama_tool, model_path, tmp_path_factory):
    """A --prompt-cache file written by a turbo3/turbo3 context."""
    cache = tmp_path_factory.mktemp("pcache") / "turbo3.cache"
    out = run(completion_cmd(llama_tool("llama-completion"), model_path, "turbo3", "turbo3", RPC_PROMPT, 2,
                             "--prompt-cache", cache))
    assert out.returncode == 0 and cache.stat().st_size > 0, out.stderr[-3000:]
    return cache


@pytest.mark.parametrize("ctk, ctv, what", [("q8_0", "q8_0", "key"), ("turbo2", "turbo2", "key"),
                                            ("turbo3", "f16", "value")])
def test_prompt_cache_file_of_another_cache_type_is_refused(llama_tool, model_path, tmp_path, turbo3_prompt_cache,
                                                            ctk, ctv, what):
    cache = tmp_path / "prompt.cache"
    shutil.copyfile(turbo3_prompt_cache, cache)
    other = run(completion_cmd(llama_tool("llama-completion"), model_path, ctk, ctv, RPC_PROMPT, 16,
                               "--prompt-cache", cache))
    assert other.returncode != 0, f"a turbo3 prompt cache was loaded into a {ctk}/{ctv} context"
    assert re.search(rf"mismatched {what} type \(\d+ != \d+, layer \d+\)", other.stderr), other.stderr[-3000:]
    assert f"failed to load session file '{cache}'" in other.stderr
    assert not other.stdout.split(RPC_PROMPT, 1)[-1].strip(), "tokens were produced"
    assert cache.read_bytes() == turbo3_prompt_cache.read_bytes(), "the refused file was overwritten"
