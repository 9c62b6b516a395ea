# fold a per-pair key scale D into a GGUF's weights (q rows * D, k rows / D, biases too): exact for attention
#   GGUF_PY=<prepared tree>/gguf-py fold.py IN OUT D.npy ALPHA   (D.npy from dcalc.py with alpha 0.5; any ALPHA is
#   derived from that entry as D^(ALPHA/0.5))
import sys, shutil, numpy as np
import os; sys.path.insert(0, os.environ['GGUF_PY'])
from gguf import GGUFReader
src, dst, dfile, alpha = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
Ds = np.load(dfile, allow_pickle=True).item()
shutil.copyfile(src, dst)
r = GGUFReader(dst, 'r+')
# (block bytes, [(offset of an f16 scale inside the block)])
LAY = {'Q4_0': (18, [0]), 'Q4_1': (20, [0, 2]), 'Q5_0': (22, [0]), 'Q5_1': (24, [0, 2]), 'Q8_0': (34, [0]),
       'Q4_K': (144, [0, 2]), 'Q5_K': (176, [0, 2]), 'Q6_K': (210, [208])}
def scale_rows(t, f):   # f: per output row factor
    ty = t.tensor_type.name
    if ty in ('F32', 'F16'):
        a = t.data; a[...] = (a.reshape(len(f), -1) * f[:, None]).reshape(a.shape).astype(a.dtype); return
    bb, offs = LAY[ty]
    a = t.data.reshape(len(f), -1, bb)
    for o in offs:
        v = a[:, :, o:o+2].copy().view(np.float16)[..., 0]
        nv = (v.astype(np.float32) * f[:, None]).astype(np.float16)
        a[:, :, o:o+2] = nv[..., None].view(np.uint8).reshape(a.shape[0], a.shape[1], 2)
T = {t.name: t for t in r.tensors}
n = 0
for key, D in Ds.items():
    il, a = key.split(':')
    if float(a) != 0.5: continue
    D = D ** (alpha / 0.5)   # derive any alpha from the 0.5 entry
    nkv, hd = D.shape
    nq = T[f'blk.{il}.attn_q.weight'].shape[1] // hd
    g = nq // nkv
    fq = np.repeat(D, g, 0).reshape(-1).astype(np.float32); fk = (1 / D).reshape(-1).astype(np.float32)
    scale_rows(T[f'blk.{il}.attn_q.weight'], fq); scale_rows(T[f'blk.{il}.attn_k.weight'], fk)
    if f'blk.{il}.attn_q.bias' in T: scale_rows(T[f'blk.{il}.attn_q.bias'], fq)
    if f'blk.{il}.attn_k.bias' in T: scale_rows(T[f'blk.{il}.attn_k.bias'], fk)
    n += 1
r.data.flush() if hasattr(r.data, 'flush') else None
print(f"folded D^{alpha} into {n} layers -> {dst}")
