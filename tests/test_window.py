"""The recent window of a turbo cache (#51): beside the compressed cells, each stream keeps the rows of its last
TURBO_WINDOW (64) + n_ubatch cells written (a turbo side's as q8_0, another side's as stored), and flash attention
reads those cells from there instead of from their codes: recent tokens take much of the attention. The ops
(ggml_set_rows_ring, ggml_flash_attn_ext_set_ring) are checked in each CPU path against a double-precision
reference (tests/c/window_attention.cpp); the cache's side (which cell each row holds, the masks, state files) by
running the model: where the window covers the whole context a turbo3 cache must read like q8_0's, and a prompt cache
file carries the window's rows (a context with another window still loads it)."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from _kv_helpers import OFFLOAD, link_llama_program, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def window_attention(llama_tool, tmp_path_factory):
    return link_llama_program(Path(__file__).parent / "c" / "window_attention.cpp",
                              tmp_path_factory.mktemp("window") / "window_attention", llama_tool)


def attention_errors(exe, tk: str, tv: str, n_q: int, n_stream: int) -> dict[str, float]:
    out = run([exe, tk, tv, n_q, n_stream])
    assert out.returncode == 0, out.stderr[-3000:]
    return {k: float(v) for k, v in (line.split() for line in out.stdout.splitlines())}


@pytest.mark.parametrize("types", ["turbo3/turbo3", "turbo2/turbo2", "turbo4/turbo4", "turbo3_64/turbo3_64",
                                   "q8_0/turbo3", "turbo3/f16"])
@pytest.mark.parametrize("n_q, n_stream", [(1, 1), (1, 2), (64, 2)])   # the GQA decode, the row path, the tiled path
def test_attention_reads_the_window(window_attention, types, n_q, n_stream):
    tk, tv = types.split("/")
    err = attention_errors(window_attention, tk, tv, n_q, n_stream)
    # the attention is the one with the window's cells as written, to the window's q8_0 rounding (measured 1e-3 to
    # 6e-3) ...
    assert err["ERR_EXACTW"] < 1.2e-2, err
    # ... and not the one that decodes them (turbo3 values: 0.2; an f16 value side with turbo3 keys: 0.03)
    assert err["ERR_DECODED"] > 4*err["ERR_EXACTW"], err


def perplexity(llama_tool, model_path, text, ctk, ctv, window: int) -> float:
    env = {**os.environ, "TURBO_WINDOW": str(window)}
    out = subprocess.run([str(c) for c in [llama_tool("llama-perplexity"), "-m", model_path, "-f", text, "-c", "512",
                                           "--chunks", "2", "-ctk", ctk, "-ctv", ctv, "-fa", "on", "-t", "2",
                                           *OFFLOAD]],
                         capture_output=True, text=True, timeout=900, env=env, stdin=subprocess.DEVNULL)
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", out.stdout + out.stderr)
    assert out.returncode == 0 and m, (out.stdout + out.stderr)[-3000:]
    return float(m.group(1))


def test_a_window_over_the_whole_context_reads_like_q8_0(llama_tool, model_path, jargon_path):
    """At 512 tokens the window (64 + 512 rows, at most the cache's 512 cells) holds every cell: turbo3 then reads
    q8_0 rows (in its rotated domain) everywhere, and its perplexity is q8_0's; without the window it is not."""
    q8 = perplexity(llama_tool, model_path, jargon_path, "q8_0", "q8_0", 64)
    with_window = perplexity(llama_tool, model_path, jargon_path, "turbo3", "turbo3", 64)
    without = perplexity(llama_tool, model_path, jargon_path, "turbo3", "turbo3", 0)
    assert abs(with_window - q8) < 0.01*q8, (with_window, q8)
    assert abs(without - q8) > 3*abs(with_window - q8), (without, with_window, q8)


PROMPT = "The history of the printing press begins in"


def completion(llama_tool, model_path, cache: Path, window: int):
    env = {**os.environ, "TURBO_WINDOW": str(window)}
    cmd = [llama_tool("llama-completion"), "-m", model_path, "-p", PROMPT, "-n", "16", "-c", "1024", "-ctk", "turbo3",
           "-ctv", "turbo3", "-fa", "on", "--temp", "0", "--top-k", "1", "--seed", "1", "-no-cnv", "--no-warmup",
           "-t", "2", *OFFLOAD, "--prompt-cache", cache]
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, env=env,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split(PROMPT, 1)[-1], out.stderr


def test_prompt_cache_carries_the_window(llama_tool, model_path, tmp_path):
    """The prompt's cells are all in the window: a prompt cache file carries their rows (it is larger than one written
    without the window by those rows), a reload continues as the first run did, and a context with no window loads
    the file too (it skips the rows and reads the cells from their codes)."""
    with_rows, without_rows = tmp_path / "w64.cache", tmp_path / "w0.cache"
    first, _ = completion(llama_tool, model_path, with_rows, 64)
    completion(llama_tool, model_path, without_rows, 0)
    assert with_rows.stat().st_size > without_rows.stat().st_size, (with_rows.stat().st_size, without_rows.stat().st_size)
    again, log = completion(llama_tool, model_path, with_rows, 64)
    assert "session file has exact match for prompt" in log, log[-3000:]
    assert again == first, (first, again)
    _, log = completion(llama_tool, model_path, with_rows, 0)
    assert "session file has exact match for prompt" in log, log[-3000:]


def kv_sizes(llama_tool, model_path, ctx: int, window: int | None) -> list[dict]:
    """llama's cache lines (each with its window) for a turbo3 context of ctx tokens; window None: TURBO_WINDOW unset"""
    from turbo_llama.eval.llama_tools import parse_kv_cache
    env = {k: v for k, v in os.environ.items() if k != "TURBO_WINDOW"}
    if window is not None:
        env["TURBO_WINDOW"] = str(window)
    cmd = [llama_tool("llama-completion"), "-m", model_path, "-p", PROMPT, "-n", "1", "-c", str(ctx), "-ctk", "turbo3",
           "-ctv", "turbo3", "-fa", "on", "-no-cnv", "--no-warmup", "-t", "2", "-lv", "4", *OFFLOAD]
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, env=env,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-3000:]
    return parse_kv_cache(out.stdout + out.stderr)["caches"]


def test_a_small_context_keeps_at_most_half_of_it_in_the_window(llama_tool, model_path):
    """Unset, the window holds at most half of a sequence's context (a 512-token slot: 256 rows in each of Gemma 3's
    two caches, not all 512, which would cost more than a q8_0 cache); TURBO_WINDOW set is kept as asked; a 4096-token
    context keeps the full 64 + 512. llama's size line counts exactly those rows."""
    small, asked, none = (kv_sizes(llama_tool, model_path, 512, w) for w in (None, 64, 0))
    assert [c["window"]["rows"] for c in small] == [256, 256], small
    assert [c["window"]["rows"] for c in asked] == [512, 512], asked
    assert all(c["window"] is None for c in none), none
    for s, a, n in zip(small, asked, none):
        row_mib = (a["mib"] - n["mib"]) / 512      # one window row over the cache's layers, both sides
        assert row_mib > 0 and s["mib"] - n["mib"] == pytest.approx(256 * row_mib, abs=0.015), (s, a, n)
    assert [c["window"]["rows"] for c in kv_sizes(llama_tool, model_path, 4096, None)] == [576, 576]
