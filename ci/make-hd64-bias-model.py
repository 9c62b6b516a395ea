#!/usr/bin/env python3
"""Writes a copy of a head_dim-64 llama GGUF (SmolLM2-135M) with a synthetic Qwen2-like key bias.

Qwen2.5 0.5B has k biases at head_dim 64; this stands in for it. Each layer gets an `attn_k.bias`: on each head's
four slowest RoPE pairs (NORM pairs 28-31, dims 56-63) a constant of B times that key channel's estimated rms
(the rows of attn_k.weight scaled by attn_norm.weight), its sign alternating with (dim + head + layer) % 3; every
other channel 0. Every other tensor and key is copied unchanged. A study input only: it measures whether the key
transform holds on biased head_dim-64 keys (results/quality-smollm2-135m.md).

    M=${TURBO_LLAMA_CACHE:-$HOME/.cache/turbo-llama}/models/SmolLM2-135M-Instruct.Q4_1.gguf
    S=$(.venv/bin/turbo-llama info | sed -n 's/^prepared: *[0-9a-f]* (\\(.*\\))/\\1/p')   # the prepared tree: its gguf-py
    PYTHONPATH=$S/gguf-py .venv/bin/python ci/make-hd64-bias-model.py "$M" /tmp/smol-kb4.gguf 4

Then each cache against the model's own f16 (results/quality-smollm2-135m.md's table; T = the jargon text):
    llama-perplexity -m /tmp/smol-kb4.gguf -f T -c 2048 --chunks 2 -fa on -t 2 --kl-divergence-base kb4-f16.kld
    llama-perplexity -m /tmp/smol-kb4.gguf -f T -c 2048 --chunks 2 -fa on -t 2 -ctk K -ctv V \\
        --kl-divergence-base kb4-f16.kld --kl-divergence

Needs numpy and gguf-py (the pinned llama.cpp's, PYTHONPATH=<prepared tree>/gguf-py).
"""
import argparse

import numpy as np
import gguf

HEAD_DIM = 64
BIAS_DIMS = range(56, 64)   # the four slowest RoPE pairs of a NORM-RoPE head of 64


def copy_fields(r, w):
    for f in r.fields.values():
        if f.name.startswith('GGUF.') or f.name == 'general.architecture':
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            sub = f.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                val = [bytes(f.parts[i]).decode('utf-8', 'replace') for i in f.data]
            else:
                val = [f.parts[i].tolist()[0] for i in f.data]
            w.add_key_value(f.name, val, t, sub_type=sub)
        elif t == gguf.GGUFValueType.STRING:
            w.add_key_value(f.name, bytes(f.parts[f.data[0]]).decode('utf-8', 'replace'), t)
        else:
            w.add_key_value(f.name, f.parts[f.data[0]].tolist()[0], t)


def key_bias(wk, g, scale, il):
    W = gguf.quants.dequantize(wk.data, wk.tensor_type).reshape(-1, int(wk.shape[0]))   # [n_embd_k, n_embd]
    rms = np.sqrt(((W * np.asarray(g.data, np.float32)[None, :])**2).sum(1))
    b = np.zeros(W.shape[0], np.float32)
    for h in range(W.shape[0] // HEAD_DIM):
        for d in BIAS_DIMS:
            i = h * HEAD_DIM + d
            b[i] = scale * rms[i] * (1 if (d + h + il) % 3 else -1)
    return rms, b


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('src', help='a head_dim-64 llama GGUF (SmolLM2-135M-Instruct.Q4_1.gguf)')
    ap.add_argument('dst', help='the GGUF to write')
    ap.add_argument('scale', type=float, help="the bias in units of each channel's rms (4 in the record)")
    a = ap.parse_args()
    r = gguf.GGUFReader(a.src)
    arch = bytes(r.fields['general.architecture'].parts[-1]).decode()
    if arch != 'llama':
        ap.error(f'{a.src}: architecture {arch!r}, not llama')
    w = gguf.GGUFWriter(a.dst, 'llama')
    copy_fields(r, w)
    tens = {t.name: t for t in r.tensors}
    n_layer = r.fields['llama.block_count'].parts[-1][0]
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    for il in range(n_layer):
        rms, b = key_bias(tens[f'blk.{il}.attn_k.weight'], tens[f'blk.{il}.attn_norm.weight'], a.scale, il)
        w.add_tensor(f'blk.{il}.attn_k.bias', b)
        if il == 0:
            print('layer 0 mean channel rms %.3f, bias |b| on 8 dims/head: %.3f' % (rms.mean(), np.abs(b[b != 0]).mean()))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print('wrote', a.dst)


if __name__ == '__main__':
    main()
