"""turbo-llama: TurboQuant KV-cache types (turbo4, turbo3, turbo2; their _64 forms for head_dim 64) for llama.cpp.

The quantizer below is the C reference in cpu_ref/, the same code that goes into ggml.
dequantize(q, type, invalid="raise"): a block whose FP16 norm is NaN, Inf or negative (never written by
quantize, rejected by ggml's validate_row_data) raises ValueError naming the first such block;
invalid="zero" decodes such blocks as zeros. Valid blocks always decode to finite values.
"""
__version__ = "0.1.0"

BLOCK_SIZE = 128   # values per turbo block (QK_TURBO in cpu_ref/ggml-turbo.h; the bindings assert it)
_BINDINGS = ("dequantize", "quantize", "rotate", "unrotate")


def __getattr__(name):
    # the bindings load on first use, so that the workflow commands (build, bench) run without them
    if name in _BINDINGS:
        from . import _turbo
        if _turbo.BLOCK_SIZE != BLOCK_SIZE:
            raise ImportError(f"turbo_llama._turbo has block size {_turbo.BLOCK_SIZE}, expected {BLOCK_SIZE}")
        return getattr(_turbo, name)
    if name == "kv_type":
        from .ggml_types import kv_type
        return kv_type
    if name.startswith("GGML_TYPE_"):
        # the ids of the built tree's ggml.h (turbo_llama.ggml_types), e.g. GGML_TYPE_TURBO3
        from .errors import ToolkitError
        from .ggml_types import ggml_types
        try:
            types = ggml_types()
        except ToolkitError as e:
            raise AttributeError(f"turbo_llama.{name}: {e.message}") from None
        if name[len("GGML_TYPE_"):] in types:
            return types[name[len("GGML_TYPE_"):]]
    raise AttributeError(f"module 'turbo_llama' has no attribute {name!r}")


TYPES = {
    "turbo4": {"block_size": BLOCK_SIZE, "type_size": 66, "bits_per_value": 66 * 8 / BLOCK_SIZE},
    "turbo3": {"block_size": BLOCK_SIZE, "type_size": 50, "bits_per_value": 50 * 8 / BLOCK_SIZE},
    "turbo2": {"block_size": BLOCK_SIZE, "type_size": 34, "bits_per_value": 34 * 8 / BLOCK_SIZE},
    # 64-value blocks for head_dim 64 models (llama picks them for -ctk/-ctv turbo4/3/2 when a head is 64-multiple
    # but not 128-multiple): the same codes, a 64-point rotation and d=64 codebooks, one FP16 norm per 64 values
    "turbo4_64": {"block_size": 64, "type_size": 34, "bits_per_value": 34 * 8 / 64},
    "turbo3_64": {"block_size": 64, "type_size": 26, "bits_per_value": 26 * 8 / 64},
    "turbo2_64": {"block_size": 64, "type_size": 18, "bits_per_value": 18 * 8 / 64},
}

__all__ = ["TYPES", "BLOCK_SIZE", "kv_type", "quantize", "dequantize", "rotate", "unrotate", "__version__"]
