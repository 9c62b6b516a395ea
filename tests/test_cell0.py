"""The exact cell-0 rows of a turbo cache on the CPU build (the ggml, ggml-cpu and KV-cache patches): a turbo SET_ROWS
keeps each stream's cell 0 exact beside the cache, and flash attention uses those rows in place of decoding cell 0,
in each of the CPU's paths (the GQA decode of one query, the row path of several streams, the tiled prefill of 64
queries). The first token of a sequence takes much of the attention (29% on Qwen2.5, half in Gemma 3's global
layers), so its quantization error weighs most. tests/c/cell0_attention.cpp compares the attention with two
references in double precision: cell 0 exact and the other cells decoded ("exact0"), and every cell decoded
("decoded0")."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from _kv_helpers import link_llama_program

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cell0_attention(llama_tool, tmp_path_factory):
    return link_llama_program(Path(__file__).parent / "c" / "cell0_attention.cpp",
                              tmp_path_factory.mktemp("cell0") / "cell0_attention", llama_tool)


def run(exe, tk: str, tv: str, n_q: int, n_stream: int, nan_head: int = -1) -> dict[str, float]:
    out = subprocess.run([str(exe), tk, tv, str(n_q), str(n_stream), str(nan_head)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return {k: float(v) for k, v in (line.split() for line in out.stdout.splitlines())}


# (n_q, n_stream): the CPU's three flash-attention paths for turbo caches
PATHS = [(1, 1), (1, 2), (64, 2)]


@pytest.mark.parametrize("types", ["turbo3/turbo3", "turbo2/turbo2", "turbo4/turbo4", "turbo3_64/turbo3_64",
                                   "turbo3/f16", "f16/turbo3"])
@pytest.mark.parametrize("n_q, n_stream", PATHS)
def test_attention_reads_cell0_exactly(cell0_attention, types, n_q, n_stream):
    tk, tv = types.split("/")
    err = run(cell0_attention, tk, tv, n_q, n_stream)
    # the attention is the one with cell 0 exact, to f32 rounding (an f16 side: upstream's f16 query or f16
    # accumulator, 1e-4 to 3e-3 measured) ...
    assert err["ERR_EXACT0"] < (5e-3 if "f16" in types else 2e-5), err
    # ... and not the one of the decoded cache, which differs by the turbo error of the sink's key and value
    assert err["ERR_DECODED0"] > 0.05, err


def test_non_turbo_key_keeps_its_own_rows(cell0_attention):
    """q8_0 K with turbo3 V: only the value's cell 0 is kept (q8_0 has no cell-0 rows); the key is q8_0's."""
    err = run(cell0_attention, "q8_0", "turbo3", 1, 1)
    assert err["ERR_EXACT0"] < 2e-3, err   # q8_0 keys meet a q8_0 query (upstream's CPU path)
    assert err["ERR_DECODED0"] > 0.05, err


@pytest.mark.parametrize("n_q, n_stream", PATHS)
def test_nan_rows_mean_decode_cell0(cell0_attention, n_q, n_stream):
    """A NaN row (not known exactly: after a K-shift that moved cell 0, or a restore without the rows) makes that
    head decode cell 0 like any other cell; the other heads still read their exact rows."""
    err = run(cell0_attention, "turbo3", "turbo3", n_q, n_stream, nan_head=1)
    assert err["ERR_EXACT0"] < 2e-5 and err["ERR_DECODED0"] > 0.05, err
    assert err["NANHEAD_DECODED0"] < 2e-5 and err["NANHEAD_EXACT0"] > 0.05, err
