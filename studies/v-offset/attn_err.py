# what a value offset does to the attention output's error under turbo V, from a qkv_dump1 dump (f16 cache)
#   GGUF_PY=<prepared tree>/gguf-py attn_err.py DUMP.bin MODEL.gguf TYPES(turbo2,turbo3)
# Per layer: causal softmax(q k / sqrt(hd)) over the dump's tokens (GQA groups), o = P v exactly, and
#   plain:  o_a = P deq(quant(v))
#   offset: o_b = P deq(quant(v - m)) + m     m = mean value of the first half of the tokens (per KV head)
#   wmean:  m = sum_j w_j v_j / sum_j w_j, w_j = sum_i p_ij^2 (the optimum for independent per-token errors)
#   sink-exact: plain, but token 0's value exact (not an offset: what the sink's own error costs)
#   bias:   m = b_v (Qwen: the GGUF's attn_v.bias), where the model has one
# prints E|o_x - o|^2 / E|o|^2 per layer and the ratio offset/plain; the share of the mean without token 0 too.
import sys, os, struct, numpy as np
sys.path.insert(0, os.environ['GGUF_PY'])
from gguf import GGUFReader
from gguf.quants import dequantize
import turbo_llama
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'key-scale'))
from qkv_dump import load   # the reader of qkv_dump1.cpp's dumps
d = load(sys.argv[1]); T = {t.name: t for t in GGUFReader(sys.argv[2]).tensors}
types = sys.argv[3].split(',')
def tq(x, ty):   # quantize/dequantize rows of x [.., hd] in 128-value blocks (ggml's C code)
    sh = x.shape; r = x.reshape(-1, sh[-1]).astype(np.float32)
    return turbo_llama.dequantize(turbo_llama.quantize(r, ty), ty).reshape(sh)
layers = sorted(int(k.split('-')[1]) for k in d if k.startswith('Vcur-') and ' ' not in k)
acc = {}
for il in layers:
    q = d[f'Qcur-{il}'][0].astype(np.float64); k = d[f'Kcur-{il}'][0].astype(np.float64); v = d[f'Vcur-{il}'][0]
    n, nkv, hd = v.shape; nq = q.shape[1]; g = nq // nkv
    kk = np.repeat(k, g, 1); vv = np.repeat(v.astype(np.float64), g, 1)
    s = np.einsum('ihd,jhd->hij', q, kk) / np.sqrt(hd)
    s = np.where(np.tril(np.ones((n, n), bool))[None], s, -np.inf)
    P = np.exp(s - s.max(-1, keepdims=True)); P /= P.sum(-1, keepdims=True)
    o = np.einsum('hij,jhd->ihd', P, vv); eo = (o ** 2).sum()
    ms = {'mean': v[: n // 2].mean(0)}
    # the offset that minimises the output error for independent per-token errors: weights w_j = sum_i p_ij^2
    w = (P ** 2).sum(1).reshape(nkv, g, n).sum(1)          # [nkv, n]
    ms['wmean'] = (np.einsum('hj,jhd->hd', w, v) / w.sum(-1, keepdims=True)).astype(np.float32)
    p0 = P[:, :, 0].mean(); v0 = ((v[0] ** 2).sum(-1) / (v ** 2).sum(-1).mean(0)).mean()
    bn = f'blk.{il}.attn_v.bias'
    if bn in T: ms['b_v'] = dequantize(T[bn].data, T[bn].tensor_type).reshape(nkv, hd).astype(np.float32)
    sh1 = (v[1:].mean(0) ** 2).sum(-1) / (v[1:] ** 2).sum(-1).mean(0)
    line = f"layer {il:2d} share(no tok 0) {sh1.mean():.3f} p(tok 0) {p0:.2f} |v_0|^2/E|v|^2 {v0:.3f}"
    for ty in types:
        ea = ((np.einsum('hij,jhd->ihd', P, np.repeat(tq(v, ty).astype(np.float64), g, 1)) - o) ** 2).sum() / eo
        acc.setdefault((ty, 'plain'), []).append(ea); line += f"  {ty} plain {ea:.5f}"
        vs = tq(v, ty); vs[0] = v[0]   # plain, but token 0 (the attention sink) kept exact
        es = ((np.einsum('hij,jhd->ihd', P, np.repeat(vs.astype(np.float64), g, 1)) - o) ** 2).sum() / eo
        acc.setdefault((ty, 'sink'), []).append(es); line += f" sink-exact {es:.5f} (x{es/ea:.3f})"
        for mn, m in ms.items():
            vb = tq(v - m[None], ty) + m[None]
            eb = ((np.einsum('hij,jhd->ihd', P, np.repeat(vb.astype(np.float64), g, 1)) - o) ** 2).sum() / eo
            acc.setdefault((ty, mn), []).append(eb); line += f" {mn} {eb:.5f} (x{eb/ea:.3f})"
    print(line, flush=True)
for ty in types:
    a = np.array(acc[(ty, 'plain')])
    for mn in ['mean', 'wmean', 'b_v', 'sink']:
        if (ty, mn) not in acc: continue
        b = np.array(acc[(ty, mn)])
        print(f"{ty}: m={mn}: output error ratio offset/plain per layer mean x{(b/a).mean():.3f} (min x{(b/a).min():.3f}, "
              f"max x{(b/a).max():.3f}); summed over layers x{b.sum()/a.sum():.3f}")
