"""Write a copy of a QK-norm GGUF whose attn_k_norm / attn_q_norm gains are rescaled per RoPE pair:
k_norm /= D, q_norm *= D with D^2 = rms(k gain pair) / rms(q gain pair) (NEOX pairs i, i+d/2).
q.k is unchanged (up to rounding); only the key's distribution over channels moves.
usage: fold_gains.py in.gguf out.gguf"""
import shutil, sys
import numpy as np
from gguf import GGUFReader

src, dst = sys.argv[1:3]
shutil.copyfile(src, dst)
r = GGUFReader(dst, "r+")
t = {x.name: x for x in r.tensors}
n = 0
for name in t:
    if not name.endswith("attn_k_norm.weight"):
        continue
    gk = t[name].data; gq = t[name.replace("attn_k_norm", "attn_q_norm")].data
    h = gk.shape[0] // 2
    pk = np.sqrt((gk[:h].astype(np.float64) ** 2 + gk[h:] ** 2) / 2)
    pq = np.sqrt((gq[:h].astype(np.float64) ** 2 + gq[h:] ** 2) / 2)
    D = np.where((pk > 0) & (pq > 0), np.sqrt(pk / np.where(pq > 0, pq, 1)), 1.0)
    D = np.concatenate([D, D])
    gk[:] = (gk / D).astype(np.float32); gq[:] = (gq * D).astype(np.float32)
    n += 1
    print(name, "D range %.3f..%.3f" % (D.min(), D.max()))
r.data.flush()
print("rescaled", n, "layers")
