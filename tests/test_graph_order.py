"""The graph patch on the CPU build: with a turbo K cache (unless TURBO_FUSE_ROPE_Q=0) llama adds q to the graph with
the attention node, so that Q's ROPE is followed only by views up to the FLASH_ATTN_EXT that reads it (the chain that
the CUDA decode kernel fuses); the operations are the same, so the logits do not change. f16 caches keep upstream's
order. tests/c/graph_order.cpp prints one decode step's nodes in compute order (llama's cb_eval) and its logits; the
ROPE_FLASH_ATTN cases of test-backend-ops (the fusion's CUDA check) run on the CPU backend here."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from _kv_helpers import link_llama_program

pytestmark = pytest.mark.slow

VIEWS = {"VIEW", "PERMUTE", "RESHAPE", "TRANSPOSE"}


@pytest.fixture(scope="module")
def graph_order(llama_tool, tmp_path_factory):
    return link_llama_program(Path(__file__).parent / "c" / "graph_order.cpp",
                              tmp_path_factory.mktemp("order") / "graph_order", llama_tool)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from turbo_llama.bench.shapes import shape_gguf
    return shape_gguf("tiny", tmp_path_factory.mktemp("shapes"))   # random weights, Llama layout


def step(exe, model, cache: str, fuse: bool | None):
    """one decode step's nodes and logits; fuse None: TURBO_FUSE_ROPE_Q unset (the default)"""
    env = {k: v for k, v in os.environ.items() if k != "TURBO_FUSE_ROPE_Q"}
    if fuse is not None:
        env["TURBO_FUSE_ROPE_Q"] = "1" if fuse else "0"
    out = subprocess.run([str(exe), str(model), cache], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout.split("=== step\n", 1)[1]
    nodes = [tuple(l.split(" ", 2)[1:]) for l in text.splitlines() if l.startswith("NODE ")]   # (op, "name | src0")
    logits = re.search(r"^LOGITS (.*)$", text, re.M).group(1)
    return nodes, logits


def rope_q_to_attention(nodes):
    """for each attention node: the ops between the ROPE of its layer's Qcur and it, whether that layer's cache
    writes (SET_ROWS) come before that ROPE, and the names of the tensors those ops view"""
    out = []
    for i, (op, desc) in enumerate(nodes):
        if op != "FLASH_ATTN_EXT":
            continue
        layer = re.search(r"Qcur-(\d+)", desc).group(1)
        r = next(j for j in range(i - 1, -1, -1) if nodes[j][0] == "ROPE" and nodes[j][1].startswith(f"Qcur-{layer} "))
        writes = [j for j in range(i) if nodes[j][0] == "SET_ROWS" and f"_l{layer} " in nodes[j][1]]
        out.append(([nodes[j][0] for j in range(r + 1, i)], len(writes) == 2 and max(writes) < r,
                    [nodes[j][1].split(" ", 1)[0] for j in range(r + 1, i)]))
    return out


@pytest.mark.parametrize("cache", ["turbo3", "turbo2"])
def test_rope_of_q_sits_next_to_the_attention(graph_order, tiny_model, cache):
    plain, logits_plain = step(graph_order, tiny_model, cache, fuse=False)
    fused, logits_fused = step(graph_order, tiny_model, cache, fuse=True)
    assert step(graph_order, tiny_model, cache, fuse=None) == (fused, logits_fused)   # on by default
    layers = rope_q_to_attention(fused)
    assert len(layers) == 2, fused   # the tiny shape has 2 layers
    for layer, (between, writes_first, viewed) in enumerate(layers):
        assert between and set(between) <= VIEWS, between
        # views of q and of the layer's cache tensors only: K, V, the cell-0 rows and the recent window's rows
        assert set(viewed) == {f"Qcur-{layer}"} | {f"cache_{t}_l{layer}" for t in ("k", "v", "k0", "v0", "kr", "vr")}, viewed
        assert writes_first
    # switched off: upstream's order (q, then v and k, then their writes, then the attention)
    assert all(not writes_first and not set(between) <= VIEWS for between, writes_first, _ in rope_q_to_attention(plain))
    assert sorted(op for op, _ in plain) == sorted(op for op, _ in fused)   # the same operations, another order
    assert logits_fused == logits_plain          # to the last printed digit


def test_f16_cache_keeps_upstream_order(graph_order, tiny_model):
    plain, logits_plain = step(graph_order, tiny_model, "f16", fuse=False)
    fused, logits_fused = step(graph_order, tiny_model, "f16", fuse=True)
    assert fused == plain and logits_fused == logits_plain


def test_backend_ops_runs_rope_attention_cases_on_cpu(llama_tool):
    """The tests patch's ROPE_FLASH_ATTN cases (ROPE -> PERMUTE -> views -> turbo FLASH_ATTN_EXT) build and run."""
    exe = llama_tool("test-backend-ops")
    out = subprocess.run([str(exe), "test", "-b", "CPU", "-o", "ROPE_FLASH_ATTN", "-p", "turbo"],
                         capture_output=True, text=True, timeout=600)
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)
    m = re.search(r"(\d+)/(\d+) tests passed", text)
    assert out.returncode == 0 and m and m.group(1) == m.group(2) and int(m.group(2)) >= 20, text[-3000:]
