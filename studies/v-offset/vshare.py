# share of the values' energy in their mean, per layer and KV head, from a qkv_dump1 dump (f16 cache)
#   GGUF_PY=<prepared tree>/gguf-py vshare.py DUMP.bin MODEL.gguf [OUT_MEANS.npy]
# prints per layer: |E v|^2 / E|v|^2 averaged over KV heads (and min/max over heads), with the GGUF's v bias
# |b_v|^2 / E|v|^2 where the model has one; OUT_MEANS.npy: {layer: mean value [n_kv, hd]} for fold_v.py
import sys, os, struct, numpy as np
sys.path.insert(0, os.environ['GGUF_PY'])
from gguf import GGUFReader
from gguf.quants import dequantize
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'key-scale'))
from qkv_dump import load   # the reader of qkv_dump1.cpp's dumps
d = load(sys.argv[1])
r = GGUFReader(sys.argv[2])
T = {t.name: t for t in r.tensors}
means, rows = {}, []
for name in sorted((k for k in d if k.startswith('Vcur-') and ' ' not in k), key=lambda s: int(s.split('-')[1])):
    il = int(name.split('-')[1])
    v = d[name][0]                       # [n_tokens, n_kv, hd]
    mu = v.mean(0)                       # [n_kv, hd]
    e = (v ** 2).sum(-1).mean(0)         # E|v|^2 per head
    share = (mu ** 2).sum(-1) / e
    resid = ((v - mu) ** 2).sum(-1).mean(0) / e   # = 1 - share
    bshare = None
    bn = f'blk.{il}.attn_v.bias'
    if bn in T:
        b = dequantize(T[bn].data, T[bn].tensor_type).reshape(-1).astype(np.float32).reshape(mu.shape)
        bshare = (b ** 2).sum(-1) / e
        bresid = ((v - b) ** 2).sum(-1).mean(0) / e   # what is left when m = b_v
    means[il] = mu
    rows.append((il, share.mean(), share.min(), share.max(), None if bshare is None else bshare.mean(),
                 None if bshare is None else bresid.mean()))
    print(f"layer {il:2d}  mean share {share.mean():.3f} (heads {share.min():.3f}-{share.max():.3f})"
          + ("" if bshare is None else f"  |b_v|^2 share {bshare.mean():.3f}  E|v-b_v|^2/E|v|^2 {bresid.mean():.3f}"))
s = np.array([x[1] for x in rows])
print(f"over {len(rows)} layers: mean share {s.mean():.3f}, min {s.min():.3f} (layer {rows[s.argmin()][0]}), "
      f"max {s.max():.3f} (layer {rows[s.argmax()][0]}); per head min {min(x[2] for x in rows):.3f} max {max(x[3] for x in rows):.3f}")
if rows[0][4] is not None:
    b = np.array([x[4] for x in rows]); br = np.array([x[5] for x in rows])
    print(f"bias alone: mean {b.mean():.3f}, min {b.min():.3f}, max {b.max():.3f}; energy left with m=b_v: mean {br.mean():.3f}")
if len(sys.argv) > 3: np.save(sys.argv[3], means, allow_pickle=True); print("means ->", sys.argv[3])
