"""The built, patched llama.cpp on CPU: ggml agrees with the bindings bit for bit, upstream's own
test tools cover the new types, and the real default model runs with turbo caches."""
import ctypes
import os
import re
import subprocess

import numpy as np
import pytest

import turbo_llama as tl

pytestmark = pytest.mark.slow

GGML_TYPE_IDS = {"turbo3": 43, "turbo2": 44}   # patches/b11312/0001: after Q2_0 = 42
GEMMA_HEAD_DIM = 256


def _find_tool(name):
    try:
        from turbo_llama.build import find_tool
        return find_tool(name)
    except ImportError:
        import shutil
        from pathlib import Path
        d = os.environ.get("TURBO_LLAMA_BIN_DIR")
        p = Path(d) / name if d else Path(shutil.which(name) or name)
        if not p.exists():
            pytest.fail(f"{name} not found: run turbo-llama build")
        return p


@pytest.fixture(scope="module")
def llama_tool():
    return _find_tool


@pytest.fixture(scope="module")
def llama_bin_dir():
    return _find_tool("llama-completion").resolve().parent


@pytest.fixture(scope="module")
def llama_build_bin(llama_bin_dir):
    return lambda name: llama_bin_dir / name


class GgmlTypeTraits(ctypes.Structure):
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


@pytest.fixture(scope="module")
def ggml(llama_bin_dir):
    candidates = [llama_bin_dir / "libggml-base.so", llama_bin_dir.parent / "lib" / "libggml-base.so"]
    lib = next((p for p in candidates if p.exists()), None)
    if lib is None:
        pytest.fail(f"libggml-base.so not found next to the built tools ({candidates})")
    g = ctypes.CDLL(str(lib))
    g.ggml_get_type_traits.restype = ctypes.POINTER(GgmlTypeTraits)
    g.ggml_get_type_traits.argtypes = [ctypes.c_int]
    g.ggml_quantize_chunk.restype = ctypes.c_size_t
    g.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                      ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    return g


@pytest.mark.parametrize("t", ["turbo3", "turbo2"])
def test_bindings_and_ggml_agree_bit_for_bit(ggml, t):
    tid = GGML_TYPE_IDS[t]
    traits = ggml.ggml_get_type_traits(tid).contents
    assert traits.type_name.decode() == t
    assert traits.blck_size == 128 and traits.type_size == tl.TYPES[t]["type_size"]
    rng = np.random.default_rng(11)
    x = rng.standard_normal((64, 512)).astype(np.float32) * rng.uniform(0.01, 50, (64, 1)).astype(np.float32)
    x[3, :128] = 0.0          # the zero block
    x[5, 200] = np.nan        # a NaN block
    x[6, 300:310] = 1e30      # a huge block
    q = np.zeros((64, 512 // 128 * traits.type_size), np.uint8)
    n = ggml.ggml_quantize_chunk(tid, x.ctypes.data, q.ctypes.data, 0, 64, 512, None)
    assert n == q.nbytes
    np.testing.assert_array_equal(q, tl.quantize(x, t))

    to_float = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(traits.to_float)
    y = np.zeros_like(x)
    to_float(q.ctypes.data, y.ctypes.data, x.size)
    np.testing.assert_array_equal(y, tl.dequantize(q, t))


def test_quantize_fns_cover_turbo(llama_build_bin):
    out = subprocess.run([str(llama_build_bin("test-quantize-fns")), "-v"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    for t in ("turbo3", "turbo2"):
        assert f"Testing {t}" in out.stdout
        assert re.search(rf"{t} absolute quantization error:\s+ok", out.stdout), out.stdout


def test_backend_ops_lists_turbo_flash_attention(llama_build_bin):
    # with only the CPU backend nothing is compared; 'support' mode lists every case it knows
    out = subprocess.run([str(llama_build_bin("test-backend-ops")), "support", "-o", "FLASH_ATTN_EXT", "-p", "turbo"],
                         capture_output=True, text=True, timeout=600)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    for pair in ("type_K=turbo3,type_V=turbo3", "type_K=turbo2,type_V=turbo2", "type_K=q8_0,type_V=turbo3",
                 "type_K=q8_0,type_V=turbo2", "type_K=f16,type_V=turbo3", "type_K=turbo3,type_V=f16"):
        assert pair in text, pair
    for op in ("SET_ROWS", "CPY", "GET_ROWS"):
        o = subprocess.run([str(llama_build_bin("test-backend-ops")), "support", "-o", op, "-p", "turbo"],
                           capture_output=True, text=True, timeout=600)
        assert "turbo3" in o.stdout and "turbo2" in o.stdout, op


def complete(tool, model, ctk, ctv, prompt, n=32, extra=()):
    cmd = [str(tool), "-m", str(model), "-p", prompt, "-n", str(n), "-c", "1024", "-ctk", ctk, "-ctv", ctv,
           "--temp", "0", "--seed", "1", "-no-cnv", "--no-warmup", "-t", str(os.cpu_count() or 2), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


PROMPT = "The history of the printing press begins in"


@pytest.mark.parametrize("ctk, ctv", [("turbo3", "turbo3"), ("turbo2", "turbo2"), ("q8_0", "turbo3"), ("turbo3", "f16")])
def test_real_model_generates_text(llama_tool, default_model, ctk, ctv):
    out = complete(llama_tool("llama-completion"), default_model, ctk, ctv, PROMPT, extra=("-fa", "on"))
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout.split(PROMPT, 1)[-1]
    words = re.findall(r"[A-Za-z]{2,}", text)
    assert len(words) >= 10, f"not enough readable text: {text!r}"
    # llama reports the cache types it really used
    assert re.search(rf"K \({ctk}\).*V \({ctv}\)", out.stderr), out.stderr[-2000:]
    n_eval = re.search(r"eval time =.*?/\s*(\d+) runs", out.stderr)
    assert n_eval and int(n_eval.group(1)) == 31, "the requested 32 tokens were not generated"


def test_turbo_types_turn_off_upstream_rotation_only_for_themselves(llama_tool, default_model):
    out = complete(llama_tool("llama-completion"), default_model, "q8_0", "turbo3", PROMPT, n=4, extra=("-fa", "on"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "attn_rot_k = 1" in out.stderr and "attn_rot_v = 0" in out.stderr


def test_turbo_without_flash_attention_is_refused(llama_tool, default_model):
    out = complete(llama_tool("llama-completion"), default_model, "turbo3", "turbo3", PROMPT, n=4, extra=("-fa", "off"))
    assert out.returncode != 0
    assert "requires flash attention" in out.stderr


def test_unknown_cache_type_is_refused(llama_tool, default_model):
    out = complete(llama_tool("llama-completion"), default_model, "turbo4", "turbo3", PROMPT, n=4)
    assert out.returncode != 0
    assert "turbo3" in (out.stderr + out.stdout)  # the message lists the allowed types
