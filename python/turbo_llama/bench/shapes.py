"""GGUF files with RANDOM weights in the shapes of real models, for speed measurements only.

llama-bench speed does not depend on the weights' values, only on shapes and types; quality is
always measured on a real model (turbo-llama eval). The files use the `llama` architecture and
Q4_0 weights written directly as bytes (fp16 block scales chosen so activations stay O(1): no
NaN/Inf), plus a dummy SentencePiece-style vocabulary of the right size so that llama.cpp loads it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

RANDOM_WEIGHTS_WARNING = ("WEIGHTS ARE RANDOM: this GGUF only has the shape of {name}; "
                          "its numbers are for speed only, never for quality.")


@dataclass(frozen=True)
class Shape:
    name: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    rope_theta: float = 500000.0
    note: str = ""


SHAPES = {
    "llama8b": Shape("llama8b", 32, 4096, 32, 8, 128, 14336, 128256, 131072,
                     note="Llama-3.1-8B shape"),
    # Qwen2.5-14B dimensions written as the llama architecture (no q/k/v biases: same speed class)
    "qwen14b": Shape("qwen14b", 48, 5120, 40, 8, 128, 13824, 152064, 131072, rope_theta=1e6,
                     note="Qwen2.5-14B dimensions (as llama arch, without q/k/v biases)"),
    "tiny": Shape("tiny", 2, 512, 4, 2, 128, 1024, 1024, 8192, note="tiny test shape"),
}

QK4_0 = 32
Q4_0_BLOCK_BYTES = 18


def _q4_0_bytes(rows: int, cols: int, rng: np.random.Generator, template: np.ndarray) -> np.ndarray:
    """Random Q4_0 rows: fp16 scale ~ 1/(4.6*sqrt(cols)) so each output has ~unit variance."""
    assert cols % QK4_0 == 0
    n_blocks = rows * cols // QK4_0
    blocks = np.resize(template, (n_blocks, Q4_0_BLOCK_BYTES)).copy()
    d = np.float16(1.0 / (4.6 * np.sqrt(cols)))
    blocks[:, 0:2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
    # shift the tiled pattern per tensor so tensors are not identical
    blocks[:, 2:] ^= np.uint8(rng.integers(0, 256))
    return blocks.reshape(rows, cols // QK4_0 * Q4_0_BLOCK_BYTES)


def write_random_gguf(shape: Shape, path: Path, seed: int = 0, progress=None) -> Path:
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    template = rng.integers(0, 256, size=(1 << 16, Q4_0_BLOCK_BYTES), dtype=np.uint8)

    w = gguf.GGUFWriter(str(path) + ".partial", "llama")
    w.add_name(f"turbo-llama random {shape.name}")
    w.add_description(RANDOM_WEIGHTS_WARNING.format(name=shape.note or shape.name))
    w.add_context_length(shape.n_ctx_train)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(shape.n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    # dummy SentencePiece vocabulary: <unk> <s> </s>, 256 byte tokens, then placeholder pieces
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    toks += [f"tok{i}" for i in range(shape.n_vocab - len(toks))]
    toks = toks[: shape.n_vocab]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    types += [gguf.TokenType.NORMAL] * (shape.n_vocab - len(types))
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores([0.0] * shape.n_vocab)
    w.add_token_types(types[: shape.n_vocab])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)

    E, F, H, HKV, D = shape.n_embd, shape.n_ff, shape.n_head, shape.n_head_kv, shape.head_dim
    plan: list[tuple[str, tuple[int, int] | int]] = [("token_embd.weight", (shape.n_vocab, E))]
    for i in range(shape.n_layer):
        plan += [(f"blk.{i}.attn_norm.weight", E),
                 (f"blk.{i}.attn_q.weight", (H * D, E)),
                 (f"blk.{i}.attn_k.weight", (HKV * D, E)),
                 (f"blk.{i}.attn_v.weight", (HKV * D, E)),
                 (f"blk.{i}.attn_output.weight", (E, H * D)),
                 (f"blk.{i}.ffn_norm.weight", E),
                 (f"blk.{i}.ffn_gate.weight", (F, E)),
                 (f"blk.{i}.ffn_up.weight", (F, E)),
                 (f"blk.{i}.ffn_down.weight", (E, F))]
    plan += [("output_norm.weight", E), ("output.weight", (shape.n_vocab, E))]

    for name, shp in plan:
        if isinstance(shp, int):
            w.add_tensor_info(name, (shp,), np.dtype(np.float32), shp * 4)
        else:
            rows, cols = shp
            nbytes = rows * cols // QK4_0 * Q4_0_BLOCK_BYTES
            w.add_tensor_info(name, (rows, cols // QK4_0 * Q4_0_BLOCK_BYTES), np.dtype(np.uint8),
                              nbytes, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shp in plan:
        if isinstance(shp, int):
            w.write_tensor_data(np.ones(shp, dtype=np.float32))
        else:
            w.write_tensor_data(_q4_0_bytes(*shp, rng, template))
        if progress is not None:
            progress(name)
    w.close()
    Path(str(path) + ".partial").replace(path)
    return path


def shape_gguf(name: str, cache_dir: Path, progress=None) -> Path:
    """The random-weight GGUF for a named shape, generated once into cache_dir."""
    if name not in SHAPES:
        raise KeyError(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")
    path = Path(cache_dir) / f"random-{name}-q4_0.gguf"
    if not path.exists():
        write_random_gguf(SHAPES[name], path, progress=progress)
    return path
