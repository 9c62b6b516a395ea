"""turbo-llama: TurboQuant KV-cache types (turbo3, turbo2) for llama.cpp.

The quantizer below is the C reference in cpu_ref/, the same code that goes into ggml.
"""
from ._turbo import BLOCK_SIZE, dequantize, quantize, rotate, unrotate

__version__ = "0.1.0"

TYPES = {
    "turbo3": {"block_size": BLOCK_SIZE, "type_size": 50, "bits_per_value": 50 * 8 / BLOCK_SIZE},
    "turbo2": {"block_size": BLOCK_SIZE, "type_size": 34, "bits_per_value": 34 * 8 / BLOCK_SIZE},
}

__all__ = ["TYPES", "BLOCK_SIZE", "quantize", "dequantize", "rotate", "unrotate", "__version__"]
