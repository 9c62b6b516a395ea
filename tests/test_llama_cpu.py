"""The built, patched llama.cpp on CPU: ggml agrees with the bindings bit for bit, upstream's own
test tools cover the new types, and the real default model runs with turbo caches."""
import os
import re
import subprocess

import pytest

from _kv_helpers import build_info, ggml_roundtrip, llama_build_bin  # noqa: F401 (fixtures)
from _kv_helpers import ggml_quantizes_as_the_bindings, rows_with_hostile_blocks

pytestmark = pytest.mark.slow

GEMMA_HEAD_DIM = 256


@pytest.mark.parametrize("t", ["turbo3", "turbo2"])
def test_bindings_and_ggml_agree_bit_for_bit(ggml_roundtrip, tmp_path, t):
    ggml_quantizes_as_the_bindings(ggml_roundtrip, t, rows_with_hostile_blocks(11, 512, 128), tmp_path)


def test_quantize_fns_cover_turbo(llama_build_bin):
    out = subprocess.run([str(llama_build_bin("test-quantize-fns")), "-v"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    for t in ("turbo3", "turbo2"):
        assert f"Testing {t}" in out.stdout
        assert re.search(rf"{t} absolute quantization error:\s+ok", out.stdout), out.stdout


def backend_ops_cpu(llama_build_bin, op: str, min_cases: int, timeout: int = 1200) -> str:
    """test-backend-ops in test mode on the CPU backend, which compares each case of op whose name matches
    'turbo' against the CPU backend's reference implementation; asserts every case passed, returns the output."""
    out = subprocess.run([str(llama_build_bin("test-backend-ops")), "test", "-b", "CPU", "-o", op, "-p", "turbo"],
                         capture_output=True, text=True, timeout=timeout)
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)
    m = re.search(r"(\d+)/(\d+) tests passed", text)
    assert out.returncode == 0 and m and m.group(1) == m.group(2), text[-3000:]
    assert int(m.group(2)) >= min_cases, m.group(0)
    return text


def test_backend_ops_cpu_turbo_attention_matches_reference(llama_build_bin):
    """Every turbo flash-attention case against the CPU backend's reference implementation (use_ref: one query row
    at a time, no tiling, no KV split, no GQA grouping): decode (the ggml-cpu patch's GQA path: keys split across
    threads, one read of each key per group, for turbo/turbo and mixed pairs alike), prefill (the nb=512 cases: the
    tiles decoded once in the rotated domain, mixed pairs too), sinks, ALiBi and softcapping."""
    text = backend_ops_cpu(llama_build_bin, "FLASH_ATTN_EXT", 500)   # the tests patch's turbo cases
    for case in ("nb=1,mask=1,sinks=0,max_bias=8.000000", "logit_softcap=30.000000", "nr23=[8,1],kv=1024,nb=1",
                 "nr23=[4,1],kv=1024,nb=1,mask=1,sinks=0,max_bias=0.000000,logit_softcap=0.000000,prec=f32,"
                 "type_K=q8_0,type_V=turbo3"):   # a mixed pair's GQA decode
        assert case in text, case
    assert re.search(r"nb=512,.*type_K=turbo3,type_V=turbo3.*OK", text), "no tiled-path case ran"


def test_backend_ops_cpu_turbo_cache_writes_match_reference(llama_build_bin):
    """The cache-write cases that the CUDA backend fuses (the key offset's SUB + the K write, and the V write
    after it in the same launch) run on the CPU against its reference too, both caches compared (fusion_test_nodes)."""
    text = backend_ops_cpu(llama_build_bin, "SUB_SET_ROWS", 20, timeout=600)
    for case in ("type=turbo3,ne_k=[128,8,1],n_rows=1024,type_v=turbo2,with_v=1",
                 "type=turbo2,ne_k=[256,1,1],n_rows=64,type_v=turbo3,with_v=1"):
        assert case + "): OK" in text, case


def test_backend_ops_lists_turbo_flash_attention(llama_build_bin):
    # with only the CPU backend nothing is compared; 'support' mode on CPU lists every case it knows
    out = subprocess.run([str(llama_build_bin("test-backend-ops")), "support", "-b", "CPU", "-o", "FLASH_ATTN_EXT",
                          "-p", "turbo"], capture_output=True, text=True, timeout=600)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    for pair in ("type_K=turbo3,type_V=turbo3", "type_K=turbo2,type_V=turbo2", "type_K=q8_0,type_V=turbo3",
                 "type_K=q8_0,type_V=turbo2", "type_K=f16,type_V=turbo3", "type_K=turbo3,type_V=f16"):
        assert pair in text, pair
    for op in ("SET_ROWS", "CPY", "GET_ROWS"):
        o = subprocess.run([str(llama_build_bin("test-backend-ops")), "support", "-b", "CPU", "-o", op, "-p", "turbo"],
                           capture_output=True, text=True, timeout=600)
        assert "turbo3" in o.stdout and "turbo2" in o.stdout, op


def complete(tool, model, ctk, ctv, prompt, n=32, extra=()):
    cmd = [str(tool), "-m", str(model), "-p", prompt, "-n", str(n), "-c", "1024", "-ctk", ctk, "-ctv", ctv,
           "--temp", "0", "--seed", "1", "-no-cnv", "--no-warmup", "-lv", "4", "-t", str(os.cpu_count() or 2), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


PROMPT = "The history of the printing press begins in"


# turbo2 keys degraded greedy text into digit runs before the key transform (turbo K gain rescale and
# key offset); with them the 2-bit text is readable again (issue #8).
@pytest.mark.parametrize("ctk, ctv", [("turbo3", "turbo3"), ("turbo2", "turbo2"),
                                      ("q8_0", "turbo2"), ("q8_0", "turbo3"), ("turbo3", "f16")])
def test_real_model_generates_text(llama_tool, model_path, ctk, ctv):
    out = complete(llama_tool("llama-completion"), model_path, ctk, ctv, PROMPT, extra=("-fa", "on"))
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout.split(PROMPT, 1)[-1]
    words = re.findall(r"[A-Za-z]{2,}", text)
    assert len(words) >= 10, f"not enough readable text: {text!r}"
    # llama reports the cache types it really used
    assert re.search(rf"K \({ctk}\).*V \({ctv}\)", out.stderr), out.stderr[-2000:]
    n_eval = re.search(r"eval time =.*?/\s*(\d+) runs", out.stderr)
    assert n_eval and int(n_eval.group(1)) == 31, "the requested 32 tokens were not generated"


def test_turbo_types_turn_off_upstream_rotation_only_for_themselves(llama_tool, model_path):
    out = complete(llama_tool("llama-completion"), model_path, "q8_0", "turbo3", PROMPT, n=4, extra=("-fa", "on"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "attn_rot_k = 1" in out.stderr and "attn_rot_v = 0" in out.stderr


def test_turbo_without_flash_attention_is_refused(llama_tool, model_path):
    out = complete(llama_tool("llama-completion"), model_path, "turbo3", "turbo3", PROMPT, n=4, extra=("-fa", "off"))
    assert out.returncode != 0
    assert "requires flash attention" in out.stderr


def test_unknown_cache_type_is_refused(llama_tool, model_path):
    out = complete(llama_tool("llama-completion"), model_path, "turbo9", "turbo3", PROMPT, n=4)
    assert out.returncode != 0
    assert "turbo3" in (out.stderr + out.stdout)  # the message lists the allowed types


# a full-size SWA cache: Gemma 3's window layers keep turbo keys too (the KV-cache patch's default: q8_0 keys)
EVERY_LAYER_TURBO = ("--swa-full",)


def perplexity(tool, model, text_file, ctk, ctv, env=None, fa="on", extra=()):
    cmd = [str(tool), "-m", str(model), "-f", str(text_file), "-c", "512", "--chunks", "2", "-ctk", ctk,
           "-ctv", ctv, "-fa", fa, "-lv", "4", "-t", str(os.cpu_count() or 2), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr[-3000:]
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", out.stdout + out.stderr)
    assert m, (out.stdout + out.stderr)[-2000:]
    return float(m.group(1)), out.stderr


def test_upstream_rotation_switch_does_not_change_turbo(llama_tool, model_path, jargon_path):
    """Turbo types rotate inside each block; upstream's graph rotation is off for them, so the
    LLAMA_ATTN_ROT_DISABLE switch must not change turbo quality (and must for q4_0). With --swa-full, so that every
    layer is turbo: by default Gemma 3's window layers keep q8_0 keys, which take upstream's rotation (below)."""
    tool = llama_tool("llama-perplexity")
    on, log_on = perplexity(tool, model_path, jargon_path, "turbo3", "turbo3", extra=EVERY_LAYER_TURBO)
    off, log_off = perplexity(tool, model_path, jargon_path, "turbo3", "turbo3", {"LLAMA_ATTN_ROT_DISABLE": "1"},
                             extra=EVERY_LAYER_TURBO)
    assert "attn_rot_k = 0" in log_on and "attn_rot_v = 0" in log_on
    assert abs(on - off) <= 0.005 * on, (on, off)
    # the window layers' q8_0 keys of a turbo K cache are upstream's q8_0 keys: rotated as upstream rotates them
    _, log_mixed = perplexity(tool, model_path, jargon_path, "turbo3", "turbo3")
    assert re.search(r"attn_rot_k = 1", log_mixed) and "attn_rot_k = 0" in log_mixed, log_mixed[-3000:]
    q4_on, log_q4 = perplexity(tool, model_path, jargon_path, "q4_0", "q4_0")
    assert "attn_rot_k = 1" in log_q4  # baselines keep upstream's default


# The key transform (issue #8): a turbo K is stored as (k - m)/D with q*D on the query side. D comes from
# the model's q/k norm gains, m is a fixed per-layer mean key from a built-in probe text; both leave q.k
# unchanged up to a per-query constant, which softmax ignores.
K_TRANSFORMS_OFF = {"TURBO_K_RESCALE": "0", "TURBO_K_OFFSET": "0"}
K_TRANSFORMS_FORCED = {"TURBO_K_RESCALE": "force", "TURBO_K_OFFSET": "force"}


# On this model any change of rounding moves a 2-chunk perplexity by up to ~1%: the FFN's Q8_K activation
# quantization turns 1e-6 differences into 1e-3 and Gemma 3's post-norm gains amplify them layer by layer
# (measured: offsets scaled by 0.001 / 0.01 / 0.1 / 1 of the probe's moved PPL 20.8435 to 20.9179 / 20.7495 /
# 20.6654 / 20.6141, while the layer-0 attention agreed to 4e-7). The bound is therefore the arithmetic's own
# spread, measured in the same run as flash attention on vs off (0.7% here), with a floor of 1%.
def test_turbo_k_transforms_are_exact_on_an_f16_cache(llama_tool, model_path, jargon_path):
    """Forced onto an f16 cache, the rescale and the offset may only move rounding."""
    tool = llama_tool("llama-perplexity")
    base, log = perplexity(tool, model_path, jargon_path, "f16", "f16")
    assert "turbo K:" not in log  # nothing happens to other cache types unless forced
    other_kernel, _ = perplexity(tool, model_path, jargon_path, "f16", "f16", fa="off")
    forced, log = perplexity(tool, model_path, jargon_path, "f16", "f16", K_TRANSFORMS_FORCED)
    assert "q/k norm gains rescaled" in log and re.search(r"key offsets from a \d+-token probe on 18 layers", log)
    noise = max(2 * abs(other_kernel - base), 0.01 * base)
    assert abs(forced - base) <= noise, (base, forced, other_kernel)


def test_turbo_k_transforms_are_logged_and_repair_turbo3_keys(llama_tool, model_path, jargon_path):
    """Without them turbo3 K loses most of the model (Gemma 3 270M); with them the loss is a fraction. With
    --swa-full, so that every layer's keys are turbo3 (by default the sliding-window layers keep q8_0 keys)."""
    tool = llama_tool("llama-perplexity")
    f16, _ = perplexity(tool, model_path, jargon_path, "f16", "f16")
    plain, log = perplexity(tool, model_path, jargon_path, "turbo3", "f16", K_TRANSFORMS_OFF,
                            extra=EVERY_LAYER_TURBO)
    assert "gain rescale off (TURBO_K_RESCALE=0)" in log and "key offsets off (TURBO_K_OFFSET=0)" in log
    fixed, log = perplexity(tool, model_path, jargon_path, "turbo3", "f16", extra=EVERY_LAYER_TURBO)
    assert "q/k norm gains rescaled" in log and "key offsets from a" in log
    # the context patch computes D once per context, not by 19 ops per layer in every graph, together with the
    # norm weights it scales, so no op is left. The graphs' own computation (the same f32 steps) must give the same
    # perplexity to the last digit: swapped or misplaced q/k weights would not
    assert "gain factors of 18 layers computed once, with the q/k norm weights they scale" in log
    in_graph, log = perplexity(tool, model_path, jargon_path, "turbo3", "f16", {"TURBO_K_GAIN_ONCE": "0"},
                               extra=EVERY_LAYER_TURBO)
    assert "gain factors computed in every graph (TURBO_K_GAIN_ONCE=0)" in log
    assert in_graph == fixed, (in_graph, fixed)
    assert fixed - f16 < 0.35 * (plain - f16), (f16, plain, fixed)


def test_gemma_query_scale_joins_the_attention(llama_tool, model_path, jargon_path):
    """The graph patch: with a turbo K cache Gemma 3's query scale is the attention's kq_scale instead of a SCALE node
    after Q's RoPE: one graph node fewer per layer (18 here) and the same perplexity. A dropped or doubled scale
    (1 or 1/256 instead of 1/16) moves it by orders more than the bound."""
    tool = llama_tool("llama-perplexity")
    def nodes(log):
        m = re.search(r"graph: nodes = (\d+)", log)
        assert m, log[-2000:]
        return int(m.group(1))
    folded, log = perplexity(tool, model_path, jargon_path, "turbo3", "turbo3")
    upstream, log_up = perplexity(tool, model_path, jargon_path, "turbo3", "turbo3", {"TURBO_FUSE_ROPE_Q": "0"})
    assert nodes(log_up) - nodes(log) == 18, (nodes(log_up), nodes(log))
    assert abs(folded - upstream) <= 0.002 * upstream, (folded, upstream)


def test_turbo_gains_leave_qk_norm_mul_rope_in_a_row(llama_tool, model_path):
    """ggml-cuda fuses RMS_NORM -> MUL -> ROPE only when the three are consecutive graph nodes. The rescaled q/k norm
    weights (views of the per-context gains) must enter the graph before the norms, where the graph patch puts them,
    not between a norm and its MUL (run 19 on the GPU: 108 unfused launches per Gemma 3 token instead of 36).
    Read from ggml's scheduler dump (GGML_SCHED_DEBUG=2: every non-view node with its index) of a decode graph."""
    cmd = [str(llama_tool("llama-completion")), "-m", str(model_path), "-ctk", "turbo3", "-ctv", "turbo3", "-fa", "on",
           "-n", "2", "-p", "Hello", "-no-cnv", "--no-warmup", "-v", "-t", str(os.cpu_count() or 2)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                         env={**os.environ, "GGML_SCHED_DEBUG": "2"})
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-2000:]
    assert "gain factors of 3 layers computed once" in text   # the global layers (sliding-window keys are q8_0)
    nodes = re.findall(r"node #\s*(\d+) \(\s*([A-Z_]+)\):\s+(\S+)", text)
    assert nodes, text[-2000:]
    starts = [i for i, (n, _, _) in enumerate(nodes) if n == "0"] or [0]
    graph = nodes[starts[-1]:]                      # the last graph the scheduler split: a decode step
    index = {(op, name): int(n) for n, op, name in graph}
    norms = {int(n) for n, op, _ in graph if op == "RMS_NORM"}   # names repeat (norm-L): by index
    for il in range(18):
        for x in ("Qcur", "Kcur"):
            mul = index.get(("MUL", f"{x}_normed-{il}"))
            rope = index.get(("ROPE", f"{x}-{il}"))
            assert mul is not None and rope == mul + 1, (x, il, mul, rope)
            assert mul - 1 in norms, f"layer {il}: {x}'s RMS_NORM is not the node before its MUL (#{mul})"


def test_key_offsets_do_not_depend_on_the_ubatch_size(llama_tool, model_path):
    """The key-offset probe is one decode that llama splits into ubatches: with -ub 8 it must still see the
    whole probe text (it used to be cut to one ubatch, and skipped below 32 tokens)."""
    def probe(ub: str):
        cmd = [str(llama_tool("llama-completion")), "-m", str(model_path), "-ctk", "turbo3", "-ctv", "turbo3",
               "-fa", "on", "-ub", ub, "-b", "512", "-c", "1024", "-n", "1", "-p", "Hello", "-no-cnv",
               "--no-warmup", "-nr", "-lv", "4", "-t", str(os.cpu_count() or 2)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        text = out.stdout + out.stderr
        assert out.returncode == 0, text[-2000:]
        m = re.search(r"key offsets from a (\d+)-token probe on (\d+) layers \(the offset is (\d+)%", text)
        assert m, "no key offsets with -ub " + ub + ":\n" + "\n".join(l for l in text.splitlines() if "turbo K" in l)
        return int(m.group(1)), int(m.group(2)), int(m.group(3))
    whole, split = probe("512"), probe("8")
    assert whole[0] >= 100 and whole == split, (whole, split)
