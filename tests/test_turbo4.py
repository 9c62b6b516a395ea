"""turbo4 (issue #28 item 1) beyond the bindings' format tests (tests/test_format.py): the SIMD attention helpers
against plain C, and in the built llama.cpp: ggml's turbo4 equals the bindings bit for bit, ggml's row validation
is the bindings' invalid-block rule, upstream's test tools cover turbo4, and the real model runs with it."""
import os
import re
import subprocess

import numpy as np
import pytest

import turbo_llama as tl
from _kv_helpers import build_info, llama_build_bin  # noqa: F401 (fixtures)
from _kv_helpers import (cpu_has_avx2_fma, ggml_quantizes_as_the_bindings, link_against_ggml,
                         rows_with_hostile_blocks, run_simd_program_both_paths)


def test_turbo4_simd_attention_helpers_match_plain_c(tmp_path):
    """The 16-centroid lookup of the AVX2 path (two permutes and a blend on bit 3) against the plain C loop: the V
    accumulation bit for bit, the K dots up to summation order; every code value occurs; the GQA helpers equal the
    single-head calls; the rotated-domain dot equals the dot with the decoded block."""
    plain, simd = run_simd_program_both_paths("simd_turbo4.c", tmp_path)
    for res in (plain, simd):
        assert res["codes"] == "1" and res["gqa"] == "1" and res["dot_vs_decoded"] == "1", res
    assert plain["simd"] == "0"
    if not cpu_has_avx2_fma():
        pytest.skip("this CPU has no AVX2+FMA: only the plain path exists here")
    assert simd["simd"] == "1"
    assert simd["mad4"] == plain["mad4"]
    dots = [k for k in plain if k.startswith("dot4")]
    assert len(dots) == 64
    for k in dots:
        a, b = float(plain[k]), float(simd[k])
        assert abs(a - b) <= 1e-4 * (1.0 + abs(a)), (k, a, b)


# ---- the built llama.cpp (slow) --------------------------------------------------------------------------

@pytest.mark.slow
def test_ggml_turbo4_and_the_bindings_agree_bit_for_bit(build_info, tmp_path):
    exe = link_against_ggml(build_info, "ggml_roundtrip.c", tmp_path / "ggml_roundtrip")
    stdout, q = ggml_quantizes_as_the_bindings(exe, "turbo4", rows_with_hostile_blocks(44, 512, 128), tmp_path)
    assert f"turbo4 {64 * 4 * 66} bytes" in stdout   # 66-byte blocks, 4 per row of 512
    assert q.shape == (64, 4 * 66)


@pytest.mark.slow
@pytest.mark.parametrize("t", ["turbo4", "turbo3", "turbo2"])
def test_ggml_row_validation_is_the_bindings_rule(build_info, tmp_path, t):
    """Random rows of 3 blocks: ggml_validate_row_data accepts exactly the rows that the bindings decode without
    raising (issue #34 item 5: one rule for both)."""
    exe = link_against_ggml(build_info, "ggml_validate.c", tmp_path / "ggml_validate")
    size = tl.TYPES[t]["type_size"]
    q = np.random.default_rng(7).integers(0, 256, (400, 3 * size), dtype=np.uint8)
    q[::3, [0, size, 2 * size]] = 0x00   # every third row: all norms small positive (valid)
    q[::3, [1, size + 1, 2 * size + 1]] = 0x3C
    q.tofile(tmp_path / "q.bin")
    out = subprocess.run([str(exe), t, str(3 * size), str(tmp_path / "q.bin")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    ggml_valid = [line == "1" for line in out.stdout.split()]
    assert len(ggml_valid) == 400

    def bindings_valid(row):
        try:
            tl.dequantize(row, t)
            return True
        except ValueError:
            return False

    ours = [bindings_valid(q[r]) for r in range(400)]
    assert ours == ggml_valid
    assert 100 < sum(ours) < 300   # both kinds of rows were tried


@pytest.mark.slow
def test_quantize_fns_cover_turbo4(llama_build_bin):
    out = subprocess.run([str(llama_build_bin("test-quantize-fns")), "-v"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "Testing turbo4" in out.stdout
    for what in ("absolute quantization error", "reference implementation error", "dot product error"):
        assert re.search(rf"turbo4 {what}:\s+ok", out.stdout), (what, out.stdout[-3000:])


@pytest.mark.slow
@pytest.mark.parametrize("op, min_cases", [("FLASH_ATTN_EXT", 90), ("SET_ROWS", 8), ("CPY", 3), ("GET_ROWS", 2),
                                           ("SUB_SET_ROWS", 2)])
def test_backend_ops_cpu_turbo4_cases_match_reference(llama_build_bin, op, min_cases):
    """The tests patch's turbo4 cases on the CPU backend against its reference implementation: decode (GQA), tiled
    prefill (nb=512), mixed pairs turbo4/turbo3, turbo4/turbo2, q8_0/turbo4, f16/turbo4, sinks, ALiBi, softcap."""
    out = subprocess.run([str(llama_build_bin("test-backend-ops")), "test", "-b", "CPU", "-o", op, "-p", "turbo4"],
                         capture_output=True, text=True, timeout=1500)
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)
    m = re.search(r"(\d+)/(\d+) tests passed", text)
    assert out.returncode == 0 and m and m.group(1) == m.group(2), text[-3000:]
    assert int(m.group(2)) >= min_cases, m.group(0)
    if op == "FLASH_ATTN_EXT":
        for pair in ("type_K=turbo4,type_V=turbo4", "type_K=turbo4,type_V=turbo3", "type_K=turbo4,type_V=turbo2",
                     "type_K=q8_0,type_V=turbo4", "type_K=f16,type_V=turbo4", "type_K=turbo4,type_V=f16"):
            assert re.search(rf"nb=512,.*{pair}.*OK", text), f"no tiled prefill case for {pair}"
            assert re.search(rf"nb=1,.*{pair}.*OK", text), f"no decode case for {pair}"


PROMPT = "The history of the printing press begins in"


@pytest.mark.slow
@pytest.mark.parametrize("ctk, ctv", [("turbo4", "turbo4"), ("turbo4", "turbo2")])
def test_real_model_generates_text_with_turbo4(llama_tool, model_path, ctk, ctv):
    cmd = [str(llama_tool("llama-completion")), "-m", str(model_path), "-p", PROMPT, "-n", "32", "-c", "1024",
           "-ctk", ctk, "-ctv", ctv, "-fa", "on", "--temp", "0", "--seed", "1", "-no-cnv", "--no-warmup", "-lv", "4",
           "-t", str(os.cpu_count() or 2)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout.split(PROMPT, 1)[-1]
    assert len(re.findall(r"[A-Za-z]{2,}", text)) >= 10, f"not enough readable text: {text!r}"
    assert re.search(rf"K \({ctk}\).*V \({ctv}\)", out.stderr), out.stderr[-2000:]
    assert "turbo K" in out.stderr   # the key transform (offset/rescale) is on for turbo4 keys too


@pytest.mark.slow
def test_turbo4_without_flash_attention_is_refused(llama_tool, model_path):
    cmd = [str(llama_tool("llama-completion")), "-m", str(model_path), "-p", PROMPT, "-n", "4", "-c", "512",
           "-ctk", "turbo4", "-ctv", "turbo4", "-fa", "off", "-no-cnv", "--no-warmup"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode != 0
    assert "turbo4 KV cache requires flash attention" in out.stderr
