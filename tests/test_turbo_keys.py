"""Issue #34 items 1-3: the turbo K key data (offsets, rescaled q/k norm weights) of the context patch, on the built
CPU tools.

- the probe that measures them runs on a context of its own: the same offsets for any -c/-b/-ub, and the keys
  stored for a text do not depend on -b
- a failing probe (a vocabulary that cannot tokenize the probe text) leaves a working context without them
- they travel in --prompt-cache files: restored under another -b or TURBO_K_OFFSET=0 a file continues as the
  uninterrupted run did; a file whose key data this context cannot take, or of the older format, is refused
Default model (Gemma 3 270M), greedy, tiny contexts.
"""
from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from _kv_helpers import GPU, link_llama_program
from turbo_llama.eval.llama_tools import parse_perplexity

pytestmark = pytest.mark.slow

THREADS = str(os.cpu_count() or 2)
PROMPT = "The history of the printing press begins in"
OFFSETS = re.compile(r"key offsets from a (\d+)-token probe on (\d+) layers \(the offset is (\d+)%")


def run(cmd, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})


def completion(exe, model, *extra, ctk="turbo3", ctv="turbo3", n=16, env=None, prompt=PROMPT):
    return run([exe, "-m", model, "-p", prompt, "-n", str(n), "-ctk", ctk, "-ctv", ctv, "-fa", "on",
                "--temp", "0", "--top-k", "1", "--seed", "1", "-no-cnv", "--no-warmup", "-t", THREADS, *extra],
               env=env)


def generated(out: subprocess.CompletedProcess, prompt=PROMPT) -> str:
    return out.stdout.split(prompt, 1)[-1]


def probe_line(text: str) -> tuple[int, int, int]:
    m = OFFSETS.search(text)
    assert m, "no key offsets:\n" + "\n".join(l for l in text.splitlines() if "turbo K" in l)
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


# ------------------------------------------------------------------ item 2: the probe does not depend on the batch
def test_probe_is_the_same_for_any_context_and_batch(llama_tool, model_path):
    """A context too small for the probe text (-c 64, the text is ~200 tokens) and -b/-ub 1 get the same offsets
    as a large one: the log line (token count, layers, share of the key energy) is identical."""
    exe = llama_tool("llama-completion")
    lines = []
    for extra in (["-c", "1024"], ["-c", "64", "-b", "16", "-ub", "16"], ["-c", "256", "-b", "1", "-ub", "1"]):
        out = completion(exe, model_path, *extra, "-lv", "4", n=1, prompt="Hello")  # -lv 4: llama's INFO lines
        assert out.returncode == 0, out.stderr[-3000:]
        assert "decoded on a context of its own" in out.stderr
        lines.append(probe_line(out.stderr))
    # 3 layers: Gemma 3 270M's global layers (the 15 sliding-window layers keep their keys in q8_0)
    assert lines[0][0] >= 100 and lines[0][1] == 3 and lines[1:] == [lines[0]] * 2, lines


@pytest.fixture(scope="module")
def cached_keys(llama_tool, tmp_path_factory):
    """tests/c/cached_keys.cpp linked against the CPU build's static libraries."""
    if GPU or os.environ.get("TURBO_LLAMA_BIN_DIR"):
        pytest.skip("a CPU measurement: it links the CPU build's static libraries")
    return link_llama_program(Path(__file__).parent / "c" / "cached_keys.cpp",
                              tmp_path_factory.mktemp("keys") / "cached_keys", llama_tool)


def stored_keys(exe, model, text, ctk, n_tokens, batch, tmp_path, env=None) -> list[np.ndarray]:
    out_file = tmp_path / f"keys-{ctk}-{batch}-{len(env or {})}.bin"
    out = run([exe, model, text, ctk, n_tokens, batch, out_file, THREADS], env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    data = out_file.read_bytes()
    n_layers, n_cells = struct.unpack_from("<ii", data)
    rows, off = [], 8
    for _ in range(n_layers):
        (ne,) = struct.unpack_from("<i", data, off)
        rows.append(np.frombuffer(data, np.float32, n_cells * ne, off + 4).reshape(n_cells, ne))
        off += 4 + 4 * n_cells * ne
    return rows


def relative_difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return float(np.sqrt(sum(((x - y) ** 2).sum() for x, y in zip(a, b)) / sum((y ** 2).sum() for y in b)))


def test_turbo_keys_do_not_depend_on_the_batch(cached_keys, model_path, jargon_path, tmp_path):
    """Issue #34's case, at the source: turbo3's error against the exact transformed keys (an f16 cache with the
    rescale and the offsets forced: k/D - m) is the same whether the 128 tokens are decoded one at a time (-b 1,
    the decode kernels) or in one ubatch (the prefill kernels). With the offsets lost at -b 1 (the bug) the error
    would be the offset itself (TURBO_K_OFFSET=0 shows its size). The keys themselves are not compared between
    the batch sizes: the order of sums changes with the batch and Gemma 3 amplifies f32 rounding through its
    layers (f16 keys of the deep layers differ by ~3% between -b 1 and -b 128), so turbo3 draws its codes anew.

    The perplexity the issue quoted (-c 128 --chunks 2: 28.62 at -b 2048, 30.91 at -b 1) is that noise on 128
    scored tokens: on larger samples -b 1 and -b 8 come out better as often as worse (results/k-transforms.md)."""
    args = (cached_keys, model_path, jargon_path)
    exact = {"TURBO_K_RESCALE": "force", "TURBO_K_OFFSET": "force"}
    err = {b: relative_difference(stored_keys(*args, "turbo3", 128, b, tmp_path),
                                  stored_keys(*args, "f16", 128, b, tmp_path, env=exact)) for b in (1, 128)}
    lost = relative_difference(stored_keys(*args, "turbo3", 128, 1, tmp_path, env={"TURBO_K_OFFSET": "0"}),
                               stored_keys(*args, "f16", 128, 1, tmp_path, env=exact))
    print(f"turbo3 K error against the exact keys: -b 1 {err[1]:.4f}, -b 128 {err[128]:.4f}; offsets lost: {lost:.4f}")
    assert abs(err[1] - err[128]) <= 0.1 * err[128], err
    assert lost > 2 * err[128], (lost, err)


def perplexity_kld(exe, model, text, base, *extra, env=None) -> dict:
    """llama-perplexity on 2 chunks of 1024 tokens: without extra arguments it writes the f16 logits to base; with
    them, the mean KL divergence of that run against base ("kld_mean") and llama's KV size lines ("kv")."""
    cmd = [exe, "-m", model, "-f", text, "-c", "1024", "--chunks", "2", "-fa", "on", "-t", THREADS, "-lv", "4",
           "--kl-divergence-base", base]
    out = run(cmd + (["--kl-divergence", *extra] if extra else []), env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return parse_perplexity(out.stdout + out.stderr)


@pytest.fixture(scope="module")
def kld_args(llama_tool, model_path, jargon_path, tmp_path_factory):
    """perplexity_kld's first arguments, with the f16 logits of the 2 chunks written once for the module."""
    args = (llama_tool("llama-perplexity"), model_path, jargon_path, tmp_path_factory.mktemp("kld") / "f16.kld")
    perplexity_kld(*args)
    return args


TURBO3 = ("-ctk", "turbo3", "-ctv", "turbo3")
# the two tests below measure the keys' transform, so without the recent window: its rows (64 + n_ubatch) would cover
# a different share of the chunk at -ub 1 than in one batch, and hide the cells' codes that the tests compare
NO_WINDOW = {"TURBO_WINDOW": "0"}


@pytest.fixture(scope="module")
def turbo3_one_batch(kld_args):
    """turbo3/turbo3 in one batch per chunk (-b 1024), the default cache layout: used by the two tests below."""
    return perplexity_kld(*kld_args, *TURBO3, "-b", "1024", env=NO_WINDOW)


def test_turbo3_at_batch_1_is_as_close_to_f16_as_in_one_batch(kld_args, turbo3_one_batch):
    """Issue #34 item 2 in the output distribution: turbo3/turbo3 decoded one token at a time (-b 1) is as close to
    f16 (mean KL divergence, 2 chunks of 1024 tokens) as in one batch per chunk; the old probe, capped at the batch,
    lost the offsets at -b 1, which the TURBO_K_OFFSET=0 control shows the bound would catch. Measured 2026-12-02
    (the window layers' keys in q8_0): KLD 0.0456 at -b 1, 0.0447 at -b 1024, 0.0716 without offsets.
    Why not closer: any cache of 4 bits or less draws its codes anew when the batch changes f32 rounding (turbo3
    -b 1 against turbo3 -b 2048: KLD 0.109, upstream q4_0: 0.121; results/k-transforms.md)."""
    one = perplexity_kld(*kld_args, *TURBO3, "-b", "1", "-ub", "1", env=NO_WINDOW)["kld_mean"]
    batch = turbo3_one_batch["kld_mean"]
    lost = perplexity_kld(*kld_args, *TURBO3, "-b", "1024", env={**NO_WINDOW, "TURBO_K_OFFSET": "0"})["kld_mean"]
    print(f"mean KLD to f16: turbo3 -b 1 {one:.4f}, -b 1024 {batch:.4f}, without offsets {lost:.4f}")
    assert 0.02 < batch and one <= 1.15 * batch, (one, batch)
    assert lost > 1.15 * batch, (lost, batch)


def test_window_layers_keep_q8_0_keys(kld_args, turbo3_one_batch):
    """The KV-cache patch: with a turbo K cache, Gemma 3's 15 sliding-window layers (a cache of the window's size) store
    their keys as q8_0 and the 3 global layers as turbo3, which llama's size lines show; the output is far closer
    to f16 than with turbo3 keys in every layer (--swa-full, which keeps them so). Measured 2026-12-02: KLD 0.0447
    against 0.1361 (the transform's offsets measured for the same layers: a probe that measured the window layers
    without their rescale gave 0.2666, worse than no offsets)."""
    mixed = turbo3_one_batch
    full = perplexity_kld(*kld_args, *TURBO3, "-b", "1024", "--swa-full", env=NO_WINDOW)
    base, swa = mixed["kv"]["caches"]
    assert (base["layers"], base["type_k"], base["type_v"]) == (3, "turbo3", "turbo3"), mixed["kv"]
    assert (swa["layers"], swa["type_k"], swa["type_v"]) == (15, "q8_0", "turbo3"), mixed["kv"]
    assert [c["type_k"] for c in full["kv"]["caches"]] == ["turbo3", "turbo3"], full["kv"]
    print(f"mean KLD to f16: turbo3 {mixed['kld_mean']:.4f}, turbo3 keys in every layer {full['kld_mean']:.4f}")
    assert mixed["kld_mean"] < 0.5 * full["kld_mean"], (mixed["kld_mean"], full["kld_mean"])
    assert full["kld_mean"] < 0.2, full["kld_mean"]   # the all-turbo3 cache itself keeps its offsets right


# ----------------------------------------------------------------------- item 3: a failing probe leaves a context
def write_model_without_newline(path: Path) -> None:
    """A 2-layer random Llama (head_dim 128) whose SentencePiece-style vocab has a byte token for every byte except
    <0x0A>: tokenizing the probe text (it has newlines) throws inside llama's tokenizer."""
    import gguf
    E, H, HKV, F, L = 256, 2, 1, 512, 2
    hd = E // H
    toks = [b"<unk>", b"<s>", b"</s>"] + [("<0x%02X>" % i).encode() for i in range(256) if i != 0x0A]
    toks += [t.encode() for t in ("\u2581the", "\u2581a", "hi", "\u2581hi", "e", "t", "a", "o", "\u2581")]
    V = len(toks)
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("random-no-newline")
    w.add_context_length(2048)
    w.add_embedding_length(E)
    w.add_block_count(L)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hd)
    w.add_vocab_size(V)
    w.add_file_type(0)
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores([0.0] * V)
    w.add_token_types([2, 3, 3] + [6] * 255 + [1] * (V - 258))
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    mat = lambda r, c: (rng.standard_normal((r, c)) * 0.05).astype(np.float32)
    ones = np.ones(E, dtype=np.float32)
    w.add_tensor("token_embd.weight", mat(V, E))
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", mat(V, E))
    for i in range(L):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones)
        w.add_tensor(p + "attn_q.weight", mat(E, E))
        w.add_tensor(p + "attn_k.weight", mat(HKV * hd, E))
        w.add_tensor(p + "attn_v.weight", mat(HKV * hd, E))
        w.add_tensor(p + "attn_output.weight", mat(E, E))
        w.add_tensor(p + "ffn_norm.weight", ones)
        w.add_tensor(p + "ffn_gate.weight", mat(F, E))
        w.add_tensor(p + "ffn_up.weight", mat(F, E))
        w.add_tensor(p + "ffn_down.weight", mat(E, F))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_a_probe_that_cannot_tokenize_leaves_a_working_context(llama_tool, tmp_path):
    """Issue #34's model: turbo3 used to fail the context (`unordered_map::at`, exit 1)."""
    model = tmp_path / "no-newline.gguf"
    write_model_without_newline(model)
    exe = llama_tool("llama-completion")
    for ctk in ("f16", "turbo3"):
        out = completion(exe, model, "-c", "512", "--ignore-eos", ctk=ctk, ctv=ctk, n=4, prompt="hi")
        assert out.returncode == 0, out.stderr[-3000:]
        # the context was made and the prompt decoded (echoed); how many tokens this random model then prints is
        # not checked: with f16 too, about one run in ten ends after the prompt (seen on llama-completion b11312)
        assert out.stdout.lstrip().startswith("hi"), out.stdout
        assert "failed to initialize the context" not in out.stderr, out.stderr[-3000:]
    assert re.search(r"turbo K: no key offsets \(the probe failed: [^)]+\); keys are stored as the model "
                     r"makes them", out.stderr), out.stderr[-3000:]


# -------------------------------------------------------------------- item 1: the key data travel with the cache
LONG_PROMPT = ("The printing press was invented in the fifteenth century. Before it, books were copied by hand in "
               "monasteries and workshops, slowly and at great cost. ") * 4 + PROMPT


@pytest.fixture(scope="module")
def saved_run(llama_tool, model_path, tmp_path_factory):
    """An uninterrupted turbo3 run that saves its --prompt-cache (default -b) and continues greedily."""
    cache = tmp_path_factory.mktemp("keys") / "prompt.cache"
    out = completion(llama_tool("llama-completion"), model_path, "-c", "1024", "--prompt-cache", cache,
                     prompt=LONG_PROMPT)
    assert out.returncode == 0 and cache.stat().st_size > 0, out.stderr[-3000:]
    return cache, generated(out, LONG_PROMPT)


@pytest.mark.parametrize("extra, env", [(["-b", "16"], None), (["-b", "16"], {"TURBO_K_OFFSET": "0"}),
                                        ([], {"TURBO_K_OFFSET": "0"})])
def test_prompt_cache_restores_its_key_data(llama_tool, model_path, tmp_path, saved_run, extra, env):
    """Loaded under another -b, or into a context that computed no offsets, the file continues exactly as the run
    that wrote it. Where this context's offsets differ, the file's are taken, and the log says so."""
    cache, expected = saved_run
    copy = tmp_path / "prompt.cache"
    shutil.copyfile(cache, copy)
    out = completion(llama_tool("llama-completion"), model_path, "-c", "1024", "--prompt-cache", copy, *extra,
                     prompt=LONG_PROMPT, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "session file has exact match for prompt" in out.stderr, out.stderr[-3000:]
    differs = "the state's key offsets differ from this context's probe; using the state's" in out.stderr
    assert differs == bool(env), out.stderr[-3000:]
    assert generated(out, LONG_PROMPT) == expected


def test_prompt_cache_with_key_data_this_context_cannot_take_is_refused(llama_tool, model_path, tmp_path, saved_run):
    """A context without the key transform's gain rescale (TURBO_K_RESCALE=0) computes its queries without it: the
    file's keys, stored rescaled, cannot be used there, and the load is refused with the reason, no tokens produced."""
    cache, _ = saved_run
    copy = tmp_path / "prompt.cache"
    shutil.copyfile(cache, copy)
    out = completion(llama_tool("llama-completion"), model_path, "-c", "1024", "--prompt-cache", copy,
                     prompt=LONG_PROMPT, env={"TURBO_K_RESCALE": "0"})
    assert out.returncode != 0
    assert re.search(r"the state's q/k weights of the rescale of layer \d+ has \d+ values, this context's 0",
                     out.stderr), out.stderr[-3000:]
    assert f"failed to load session file '{copy}'" in out.stderr
    assert not generated(out, LONG_PROMPT).strip(), "tokens were produced"
    assert copy.read_bytes() == cache.read_bytes(), "the refused file was overwritten"


def test_prompt_cache_of_the_older_format_is_refused_by_version(llama_tool, model_path, tmp_path, saved_run):
    """Files of an older version (upstream's 10, turbo-llama's 11 without the window's rows) are refused by their
    version, not misread."""
    cache, _ = saved_run
    data = bytearray(cache.read_bytes())
    magic, version = struct.unpack_from("<II", data)
    assert version == 12, version
    struct.pack_into("<I", data, 4, 11)
    old = tmp_path / "old.cache"
    old.write_bytes(bytes(data))
    out = completion(llama_tool("llama-completion"), model_path, "-c", "1024", "--prompt-cache", old,
                     prompt=LONG_PROMPT)
    assert out.returncode != 0
    assert "session file version 11 is older than this build's 12 (it lacks turbo-llama's cache data)" in out.stderr, \
        out.stderr[-3000:]
