# does keeping the first token's (the attention sink's) K and V exact cut turbo's attention error?
#   GGUF_PY=<prepared tree>/gguf-py sink_err.py DUMP.bin MODEL.gguf qwen|gemma TYPES(turbo3,turbo2) [nod]
# DUMP: studies/key-scale/qkv_dump1 (q, k, v of the first 512 tokens, f16 cache, post-RoPE, q before any scale).
# Per layer, causal softmax(q.k / sqrt(hd)) over the dump's tokens (GQA groups as in the model), with the shipped key
# transform k' = (k - m) / D, q' = q * D (exact for attention; only what the quantizer sees changes):
#   m = mean key over tokens 1..N-1 (token 0 excluded, as the probe does), per layer and KV head;
#   qwen:  D^8 = E[(k-m)_a^2 + (k-m)_b^2] / E[q_a^2 + q_b^2] per NEOX pair (a, b), each side summed over the layer's
#          heads (studies/key-scale/dcalc.py ... neox 0.5 ... shared, i.e. patch 0041);
#   gemma: D^4 = (gk_a^2 + gk_b^2) / (gq_a^2 + gq_b^2) from attn_k_norm / attn_q_norm (patch 0007), NEOX pairs;
#   nod:   D = 1 (offset only).
# Variants, per turbo type T (K and V both T):
#   a  all keys and values turbo
#   b  token 0's key exact, values turbo
#   c  token 0's key and value exact
#   d  f16 (the reference: the dump's values, float64 arithmetic)
#   c4 tokens 0-3's keys and values exact (StreamingLLM's four sink tokens)
#   aK, bK: a and b with all values exact (the keys' share of the output error)
# Metrics per layer: mean KL(P_ref || P_x) over the attention rows (heads x queries), relative output error
# |o - o_ref|^2 / |o_ref|^2 (summed over rows and heads), the sink's mass p(tok 0) (mean over rows), and
# |k'_0|^2 / E|k'_j|^2 (j >= 1): the sink's stored key energy against an ordinary key's.
import sys, os, struct, numpy as np
sys.path.insert(0, os.environ['GGUF_PY'])
from gguf import GGUFReader
from gguf.quants import dequantize
import turbo_llama
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'key-scale'))
from qkv_dump import load   # the reader of qkv_dump1.cpp's dumps


def tq(x, ty):   # quantize/dequantize rows of x [.., hd] in 128-value blocks (ggml's C code)
    sh = x.shape; r = np.ascontiguousarray(x.reshape(-1, sh[-1]), np.float32)
    return turbo_llama.dequantize(turbo_llama.quantize(r, ty), ty).reshape(sh).astype(np.float64)


def pair_sum(x):  # NEOX pairs (i, i + hd/2) over the last axis -> [.., hd/2]
    h = x.shape[-1] // 2
    return x[..., :h] + x[..., h:]


dump, gguf_fn, arch, types = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(',')
nod = len(sys.argv) > 5 and sys.argv[5] == 'nod'
d = load(dump); T = {t.name: t for t in GGUFReader(gguf_fn).tensors}
layers = sorted(int(k.split('-')[1]) for k in d if k.startswith('Kcur-'))
acc = {}; rows = []
print(f"# {os.path.basename(dump)} {os.path.basename(gguf_fn)} {arch} D={'1' if nod else 'shipped'}")
for il in layers:
    q = d[f'Qcur-{il}'].astype(np.float64); k = d[f'Kcur-{il}'].astype(np.float64); v = d[f'Vcur-{il}'].astype(np.float64)
    n, nkv, hd = k.shape; nq = q.shape[1]; g = nq // nkv
    m = k[1:].mean(0)                                                  # [nkv, hd]
    if nod:
        D = np.ones(hd)
    elif arch == 'qwen':
        ek = ((k[1:] - m) ** 2).mean(0).sum(0); eq = (q[1:] ** 2).mean(0).sum(0) / g   # summed over KV heads
        r = np.maximum(pair_sum(ek) / np.maximum(pair_sum(eq), 1e-12), 1e-12)
        D = np.concatenate([r, r]) ** (1 / 8)
    else:
        def w(nm):
            t = T[f'blk.{il}.{nm}.weight']; return dequantize(t.data, t.tensor_type).reshape(-1).astype(np.float64)
        gk, gq = w('attn_k_norm') ** 2, w('attn_q_norm') ** 2
        pk, pq = pair_sum(gk), pair_sum(gq)
        r = np.where((pk > 0) | (pq > 0), pk / np.maximum(pq, 1e-20), 1.0)
        D = np.concatenate([r, r]) ** 0.25
    ks = (k - m) / D; qs = q * D                                        # stored key, query as it enters attention
    qh = qs.transpose(1, 0, 2)                                          # [nq, n, hd]
    mask = np.tril(np.ones((n, n), bool))[None]

    def probs(kst):
        kk = np.repeat(kst, g, 1).transpose(1, 2, 0)                    # [nq, hd, n]
        s = np.where(mask, (qh @ kk) / np.sqrt(hd), -np.inf)
        s -= s.max(-1, keepdims=True); P = np.exp(s); P /= P.sum(-1, keepdims=True)
        return P

    def out(P, vv):
        return P @ np.repeat(vv, g, 1).transpose(1, 0, 2)               # [nq, n, hd]

    P = probs(ks); o = out(P, v); eo = (o ** 2).sum()
    lP = np.log(np.where(mask, P, 1.0))
    p0 = P[:, :, 0].mean(); k0 = ((ks[0] ** 2).sum(-1) / (ks[1:] ** 2).sum(-1).mean(0)).mean()
    line = f"layer {il:2d} p(tok0) {p0:.3f} |k'0|^2/E|k'|^2 {k0:6.2f}"
    row = {'layer': il, 'p0': p0, 'k0': k0}
    for ty in types:
        kt = tq(ks, ty); vt = tq(v, ty)
        kb = kt.copy(); kb[0] = ks[0]; vc = vt.copy(); vc[0] = v[0]
        k4 = kt.copy(); k4[:4] = ks[:4]; v4 = vt.copy(); v4[:4] = v[:4]
        Pa, Pb, P4 = probs(kt), probs(kb), probs(k4)
        kl = lambda Px: (P * (lP - np.log(np.where(mask, Px, 1.0)))).sum(-1).mean()
        err = lambda Px, vv: ((out(Px, vv) - o) ** 2).sum() / eo
        r = {'klA': kl(Pa), 'klB': kl(Pb), 'a': err(Pa, vt), 'b': err(Pb, vt), 'c': err(Pb, vc), 'kl4': kl(P4), 'c4': err(P4, v4),
             'aK': err(Pa, v), 'bK': err(Pb, v)}
        for key, val in r.items(): acc.setdefault((ty, key), []).append(val); row[f'{ty}:{key}'] = val
        line += (f" | {ty} KL a {r['klA']:.5f} b {r['klB']:.5f} (x{r['klB']/r['klA']:.3f})"
                 f" err a {r['a']:.5f} b {r['b']:.5f} c {r['c']:.5f} (b x{r['b']/r['a']:.3f} c x{r['c']/r['a']:.3f}) c4 KL {r['kl4']:.5f} err {r['c4']:.5f}"
                 f" keys-only a {r['aK']:.5f} b {r['bK']:.5f}")
    rows.append(row); print(line, flush=True)


def summary(name, sel):
    print(f"## {name}: layers {sel}")
    idx = [layers.index(l) for l in sel]
    print(f"  sink mass p(tok0): mean {np.mean([rows[i]['p0'] for i in idx]):.3f}")
    for ty in types:
        A = {key: np.array(acc[(ty, key)])[idx] for key in ['klA', 'klB', 'a', 'b', 'c', 'aK', 'bK', 'kl4', 'c4']}
        print(f"  {ty}: mean KL a {A['klA'].mean():.5f} b {A['klB'].mean():.5f} (x{A['klB'].mean()/A['klA'].mean():.3f});"
              f" output error (mean over layers) a {A['a'].mean():.5f} b {A['b'].mean():.5f}"
              f" (x{A['b'].mean()/A['a'].mean():.3f}) c {A['c'].mean():.5f} (x{A['c'].mean()/A['a'].mean():.3f});"
              f" c4: KL {A['kl4'].mean():.5f} (x{A['kl4'].mean()/A['klA'].mean():.3f}) error {A['c4'].mean():.5f} (x{A['c4'].mean()/A['a'].mean():.3f});"
              f" keys only (V exact) a {A['aK'].mean():.5f} b {A['bK'].mean():.5f} (x{A['bK'].mean()/A['aK'].mean():.3f});"
              f" per-layer ratio KL b/a min x{(A['klB']/A['klA']).min():.3f} max x{(A['klB']/A['klA']).max():.3f}")


summary('all layers', layers)
if arch == 'gemma':   # the global layers: the only ones whose keys are turbo in the shipped iSWA cache (0039)
    summary('global layers (turbo keys when shipped; window layers keep q8_0 keys)', [l for l in layers if l % 6 == 5])
    summary('window layers', [l for l in layers if l % 6 != 5])
