#!/usr/bin/env python3
"""Writes a random-weight Q4_0 GGUF in the Llama-3.1-8B shape (for speed measurements only).

THE WEIGHTS ARE RANDOM: the model's outputs are meaningless; only its shape (32 layers, n_embd 4096,
32 query heads, 8 KV heads, head_dim 128, n_ff 14336, vocab 128256) matters for speed.
Uses gguf-py from the prepared llama.cpp tree (PYTHONPATH=<tree>/gguf-py) and numpy.
"""
import sys
import numpy as np
import gguf

SHAPES = {
    "llama8b": dict(n_embd=4096, n_layer=32, n_head=32, n_head_kv=8, n_ff=14336, n_vocab=128256, ctx=131072, theta=500000.0),
}


def main():
    out = sys.argv[1]
    shape = SHAPES[sys.argv[2] if len(sys.argv) > 2 else "llama8b"]
    print("WARNING: writing a RANDOM-WEIGHT model; numbers from it are for speed only", flush=True)
    E, L, H, HKV, F, V = (shape[k] for k in ("n_embd", "n_layer", "n_head", "n_head_kv", "n_ff", "n_vocab"))
    hd = E // H
    qt = gguf.GGMLQuantizationType.Q4_0
    # one pool of Q4_0 blocks (scale 0.002, random nibbles) sliced for every tensor
    biggest = max(V * E, F * E) // 32
    rng = np.random.default_rng(0)
    pool = np.empty((biggest, 18), dtype=np.uint8)
    pool[:, 2:] = rng.integers(0, 256, size=(biggest, 16), dtype=np.uint8)
    pool[:, 0:2] = np.frombuffer(np.float16(0.002).tobytes(), dtype=np.uint8)
    flat = pool.reshape(-1)

    def q4(rows, cols):
        nb = rows * cols // 32
        return flat[: nb * 18].reshape(rows, cols // 32 * 18)

    w = gguf.GGUFWriter(out, "llama")
    w.add_name("random-llama-3.1-8b-shape")
    w.add_context_length(shape["ctx"])
    w.add_embedding_length(E)
    w.add_block_count(L)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_rope_freq_base(shape["theta"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hd)
    w.add_vocab_size(V)
    w.add_file_type(2)  # MOSTLY_Q4_0
    toks = [b"<unk>", b"<s>", b"</s>"] + [("<0x%02X>" % i).encode() for i in range(256)]
    toks += [("t%d" % i).encode() for i in range(V - len(toks))]
    types = [2, 3, 3] + [6] * 256 + [1] * (V - 259)
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores([0.0] * V)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    ones = np.ones(E, dtype=np.float32)
    w.add_tensor("token_embd.weight", q4(V, E), raw_dtype=qt)
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", q4(V, E), raw_dtype=qt)
    for i in range(L):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones)
        w.add_tensor(p + "attn_q.weight", q4(E, E), raw_dtype=qt)
        w.add_tensor(p + "attn_k.weight", q4(HKV * hd, E), raw_dtype=qt)
        w.add_tensor(p + "attn_v.weight", q4(HKV * hd, E), raw_dtype=qt)
        w.add_tensor(p + "attn_output.weight", q4(E, E), raw_dtype=qt)
        w.add_tensor(p + "ffn_norm.weight", ones)
        w.add_tensor(p + "ffn_gate.weight", q4(F, E), raw_dtype=qt)
        w.add_tensor(p + "ffn_up.weight", q4(F, E), raw_dtype=qt)
        w.add_tensor(p + "ffn_down.weight", q4(E, F), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote", out, flush=True)


if __name__ == "__main__":
    main()
