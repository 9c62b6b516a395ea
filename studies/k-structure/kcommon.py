"""Shared helpers: RoPE (NEOX), q4_0 reference, quantizer wrappers, model gains."""
import sys, numpy as np, gguf
import turbo_llama as tl
from turbo_llama import model

GLOB = {5, 11, 17}
D = 256; HALF = 128; SCALE = 1 / 16  # f_attention_scale = 1/sqrt(256)
rd = gguf.GGUFReader(str(model.default_model()))  # the default model, Gemma 3 270M (these helpers assume its shapes)
GQ = {int(t.name.split('.')[1]): np.array(t.data, np.float64) for t in rd.tensors if t.name.endswith('attn_q_norm.weight')}
GK = {int(t.name.split('.')[1]): np.array(t.data, np.float64) for t in rd.tensors if t.name.endswith('attn_k_norm.weight')}

def dscale(il):  # weight-only per-RoPE-pair rescale k/D, q*D (attention-exact), D^2 = rms pair gain_k / rms pair gain_q
    pk = np.sqrt((GK[il][:128] ** 2 + GK[il][128:] ** 2) / 2); pq = np.sqrt((GQ[il][:128] ** 2 + GQ[il][128:] ** 2) / 2)
    d = np.sqrt(pk / np.maximum(pq, 1e-3)); return np.concatenate([d, d])
def hadamard(n):  # Sylvester's construction (n a power of two), entries +-1, symmetric
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h
H = hadamard(D) / np.sqrt(D)

def theta(il):
    base = 1e6 if il in GLOB else 1e4
    return base ** (-np.arange(HALF) * 2 / D)

def rope(x, pos, il, sign=1):  # NEOX: pairs (i, i+128)
    a = sign * pos[:, None] * theta(il)[None]
    c, s = np.cos(a), np.sin(a)
    x0, x1 = x[:, :HALF], x[:, HALF:]
    return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], 1)

def q4_0(x):  # ggml quantize_row_q4_0_ref semantics on blocks of 32
    b = x.reshape(-1, 32)
    idx = np.argmax(np.abs(b), 1); mx = b[np.arange(len(b)), idx]
    d = mx / -8; idd = np.where(d != 0, 1 / np.where(d == 0, 1, d), 0)
    q = np.minimum(15, np.trunc(b * idd[:, None] + 8.5)).astype(np.int8)
    d16 = d.astype(np.float16).astype(np.float64)
    return ((q - 8) * d16[:, None]).reshape(x.shape)

def quant(x, kind):
    x = np.ascontiguousarray(x, np.float32)
    if kind == 'q4_0H':  # llama.cpp attn_rot_k: 256-Hadamard, q4_0, inverse (H symmetric, H@H = I)
        return q4_0(x @ H) @ H
    if kind == 'q4_0':
        return q4_0(x.astype(np.float64))
    return tl.dequantize(tl.quantize(x, kind), kind).reshape(x.shape).astype(np.float64)

def softmax(s):
    s = s - s.max(1, keepdims=True); e = np.exp(s); return e / e.sum(1, keepdims=True)

def kl(p, q):
    return np.mean(np.sum(p * (np.log(p + 1e-30) - np.log(q + 1e-30)), 1))

