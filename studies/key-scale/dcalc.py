# per-pair D = (E[(k-m)^2] / E[q^2])^(alpha/4) per layer and KV head from a Q/K/V dump -> npy dict {"il:alpha": (n_kv, hd)}
#   dcalc.py DUMP neox|norm ALPHAS OUT.npy [shared]   (ALPHAS: comma separated; D = ratio^(alpha/4))
import struct, sys
import numpy as np


def load(p):
    """qkv_dump1's file: int32 count, then per tensor: int32 name length, name, 4 x int64 ne, f32 data."""
    f = open(p, 'rb'); n = struct.unpack('i', f.read(4))[0]; out = {}
    for _ in range(n):
        L = struct.unpack('i', f.read(4))[0]; name = f.read(L).decode(); ne = struct.unpack('4q', f.read(32))
        a = np.frombuffer(f.read(int(np.prod(ne)) * 4), dtype=np.float32)
        if '(' not in name:
            out[name] = a.reshape(ne[::-1]).squeeze(0)  # (tokens, heads, head_dim)
    return out


p, pairing, out = sys.argv[1], sys.argv[2], sys.argv[4]
alphas = [float(a) for a in sys.argv[3].split(',')]
d = load(p); layers = sorted({int(k.split('-')[1]) for k in d}); Ds = {}
for il in layers:
    Q = d[f'Qcur-{il}']; K = d[f'Kcur-{il}']; T, nh, hd = Q.shape; nkv = K.shape[1]; g = nh // nkv
    Kc = K - K[1:].mean(0, keepdims=True)
    ek = (Kc[1:]**2).mean(0); eq = (Q[1:]**2).mean(0).reshape(nkv, g, hd).mean(1)
    if pairing == 'neox':
        pk = ek[:, :hd//2] + ek[:, hd//2:]; pq = eq[:, :hd//2] + eq[:, hd//2:]; expand = lambda x: np.concatenate([x, x], 1)
    else:
        pk = ek[:, 0::2] + ek[:, 1::2]; pq = eq[:, 0::2] + eq[:, 1::2]; expand = lambda x: np.repeat(x, 2, 1)
    if len(sys.argv) > 5 and sys.argv[5] == 'shared':   # one D per pair for all heads of the layer
        pk = np.repeat(pk.sum(0, keepdims=True), nkv, 0); pq = np.repeat(pq.sum(0, keepdims=True), nkv, 0)
    ratio = np.maximum(pk / np.maximum(pq, 1e-12), 1e-12)
    for a in alphas: Ds[f"{il}:{a}"] = expand(ratio**(a/4)).astype(np.float32)
np.save(out, Ds, allow_pickle=True); print(len(Ds), "D arrays ->", out)
