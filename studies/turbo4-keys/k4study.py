# Are turbo keys at the scalar quantizer's optimum on a real model? Per layer of a q/k dump (qkv_dump1.cpp, f16 cache,
# post-RoPE), keys stored as the shipped transform stores them (k' = (k - m)/D, q' = q*D, D^8 = key/query energy per NEOX
# pair: patch 0041), cell 0 exact: the stored keys' relative error against Lloyd-Max theory, the same with a dense random
# rotation in front of the shipped one (H D Q: "more random"), and the attention rows' KL (keys only) per layer.
#   GGUF_PY=<prepared tree>/gguf-py k4study.py DUMP.bin [turbo4|turbo3|turbo2]
import sys, os, re, numpy as np
sys.path.insert(0, os.environ['GGUF_PY'])
import turbo_llama
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'key-scale'))
from qkv_dump import load
d = load(sys.argv[1]); ty = sys.argv[2] if len(sys.argv) > 2 else 'turbo4'
rng = np.random.default_rng(0)
def tq(x):
    sh = x.shape; r = np.ascontiguousarray(x.reshape(-1, sh[-1]), np.float32)
    return turbo_llama.dequantize(turbo_llama.quantize(r, ty), ty).reshape(sh).astype(np.float64)
def pair_sum(x):
    h = x.shape[-1] // 2; return x[..., :h] + x[..., h:]
layers = sorted(int(k.split('-')[1]) for k in d if re.match(r'^Kcur-\d+$', k))
tot = {}
for il in layers:
    q = d[f'Qcur-{il}'].reshape(-1, *d[f'Qcur-{il}'].shape[-2:]).astype(np.float64); k = d[f'Kcur-{il}'].reshape(-1, *d[f'Kcur-{il}'].shape[-2:]).astype(np.float64)
    n, nkv, hd = k.shape; nq = q.shape[1]; g = nq // nkv
    m = k[1:].mean(0)
    ek = ((k[1:] - m) ** 2).mean(0).sum(0); eq = (q[1:] ** 2).mean(0).sum(0) / g
    r = np.maximum(pair_sum(ek) / np.maximum(pair_sum(eq), 1e-12), 1e-12)
    D = np.concatenate([r, r]) ** (1 / 8)
    ks = (k - m) / D; qs = q * D
    qh = qs.transpose(1, 0, 2); mask = np.tril(np.ones((n, n), bool))[None]
    def probs(kst):
        kk = np.repeat(kst, g, 1).transpose(1, 2, 0)
        s = np.where(mask, (qh @ kk) / np.sqrt(hd), -np.inf)
        s -= s.max(-1, keepdims=True); P = np.exp(s); P /= P.sum(-1, keepdims=True); return P
    P = probs(ks); lP = np.log(np.where(mask, P, 1.0))
    kl = lambda Px: (P * (lP - np.log(np.where(mask, Px, 1.0)))).sum(-1).mean()
    res = {}
    kt = tq(ks); kt[0] = ks[0]
    res['mse'] = (((kt[1:] - ks[1:]) ** 2).sum(-1) / (ks[1:] ** 2).sum(-1)).mean()
    res['kl'] = kl(probs(kt))
    Q, _ = np.linalg.qr(rng.standard_normal((hd, hd)))
    kq = tq(ks @ Q.T) @ Q; kq[0] = ks[0]
    res['mse_dense'] = (((kq[1:] - ks[1:]) ** 2).sum(-1) / (ks[1:] ** 2).sum(-1)).mean()
    res['kl_dense'] = kl(probs(kq))
    # the score error's scale: E|q'|^2 E|k'|^2 / hd (what the quantizer's relative error multiplies)
    res['qk'] = (qs[1:] ** 2).sum(-1).mean() * (ks[1:] ** 2).sum(-1).mean() / hd
    for key, v in res.items(): tot.setdefault(key, []).append(v)
    print(f"layer {il:2d} mse {res['mse']:.5f} dense {res['mse_dense']:.5f} | KL {res['kl']:.6f} dense {res['kl_dense']:.6f} | E|q'|^2E|k'|^2/hd {res['qk']:.1f}", flush=True)
A = {k: np.array(v) for k, v in tot.items()}
print(f"mean mse {A['mse'].mean():.5f} dense {A['mse_dense'].mean():.5f}; KL {A['kl'].mean():.6f} dense {A['kl_dense'].mean():.6f}")
s = np.sort(A['kl'])[::-1]; print("KL share of the top 3/5/10 layers:", [round(s[:j].sum()/s.sum(), 3) for j in (3, 5, 10)], "order", list(np.argsort(-A['kl'])[:8]))
