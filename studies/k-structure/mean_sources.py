#!/usr/bin/env python3
"""How much of |k|^2 a practical mean removes: full-sequence (oracle) mean, causal prefix mean of the
first N tokens, and the other text's mean (static per-layer constant). turbo3 err/E for each.
usage: mean_sources.py capA.npz capB.npz"""
import sys, numpy as np, turbo_llama as tl
A, B = np.load(sys.argv[1]), np.load(sys.argv[2])
def get(c, il):
    K = c[f'K{il}'].astype(np.float64); o = np.argsort(c[f'pos{il}']); K = K[o]
    return K[1:] if c[f'pos{il}'][o][0] == 0 else K
def t3(X):
    X = np.ascontiguousarray(X, np.float32); return tl.dequantize(tl.quantize(X, 'turbo3'), 'turbo3').reshape(X.shape)
print('| L | text | E_res/E: full mean | prefix-16 | prefix-64 | other text mean | turbo3 err/E: none | full | prefix-64 | other text |')
print('|---|---|---|---|---|---|---|---|---|---|')
for il in [0, 2, 5, 8, 11, 15, 17]:
    for name, c, o in [('A', A, B), ('B', B, A)]:
        K = get(c, il); E = (K ** 2).sum()
        ms = {'full': K.mean(0), 'p16': K[:16].mean(0), 'p64': K[:64].mean(0), 'other': get(o, il).mean(0)}
        res = {k: ((K - m) ** 2).sum() / E for k, m in ms.items()}
        err = {k: ((t3(K - m) + m - K) ** 2).sum() / E for k, m in ms.items()}
        err0 = ((t3(K) - K) ** 2).sum() / E
        print(f"| {il} | {name} | {res['full']:.3f} | {res['p16']:.3f} | {res['p64']:.3f} | {res['other']:.3f} | {err0:.4f} | {err['full']:.4f} | {err['p64']:.4f} | {err['other']:.4f} |")
