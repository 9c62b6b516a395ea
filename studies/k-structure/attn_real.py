#!/usr/bin/env python3
"""Attention-level effect of K/V quantization with the model's REAL post-RoPE queries (from qkv_dump).
usage: attn_real.py DUMPDIR [OTHER_DUMPDIR]  (OTHER gives the cross-text mean 'mx')
K variants: k plain; m: k - mean over the sequence (BOS excluded); mx: k - mean of the OTHER text; mp: k - R_pos(mean of
un-RoPEd keys); Dm/Dmp: also rescale each RoPE pair k/D, q*D (exact for attention), D^2 = rms(k pair)/rms(q pair)
measured on this text (oracle); G/Gm/Gmx/Gmp: D from the learned k/q norm gains only (+ the given mean). V variants: attention output error only.
Reference = f16-rounded K/V (what the f16 cache holds). Per layer, 4 query heads, 384 query positions
in [512, n), causal, SWA layers: keys j > i-512. logits = q.k/16 (f_attention_scale = 1/sqrt(256))."""
import sys, numpy as np
sys.path.insert(0, __file__.rsplit('/', 1)[0])
from kcommon import quant, rope, GLOB, GK, GQ, softmax  # noqa: E402

def load(d, name, il, w):
    x = np.fromfile(f'{d}/{name}-{il}.f32', np.float32).reshape(-1, w)
    n = np.fromfile(f'{d}/tokens.i32', np.int32).size
    return x[-n:].astype(np.float64)  # the scheduler's reserve passes also hit cb_eval: keep the last pass

d0 = sys.argv[1]; d1 = sys.argv[2] if len(sys.argv) > 2 else None
rng = np.random.default_rng(1)
KV = [('turbo3', 'k'), ('turbo3', 'm'), ('turbo3', 'mx'), ('turbo3', 'mp'), ('turbo3', 'Dm'), ('turbo3', 'Dmp'), ('turbo3', 'Gm'),
      ('turbo2', 'k'), ('turbo2', 'm'), ('turbo2', 'mp'), ('q4_0H', 'k'), ('q4_0H', 'm'), ('q4_0', 'k')]
VV = ['turbo3', 'q4_0H']
import os
if os.environ.get('KV'):  # e.g. KV=turbo3:G,turbo3:Gmx to run a subset
    KV = [tuple(x.split(':')) for x in os.environ['KV'].split(',')]
tot = {}
hdr = ('| L | sd_sig | ' + ' | '.join(f'K {a}({b}) sd_err / KL / out' for a, b in KV) +
       ' | ' + ' | '.join(f'V {a} out' for a in VV) + ' |')
print(hdr); print('|' + '---|' * (2 + len(KV) + len(VV)))
LAYERS = [int(x) for x in os.environ['LAYERS'].split(',')] if os.environ.get('LAYERS') else range(18)
for il in LAYERS:
    K = load(d0, 'Kcur', il, 256).astype(np.float16).astype(np.float64)
    V = load(d0, 'Vcur', il, 256).astype(np.float16).astype(np.float64)
    Q = load(d0, 'Qcur', il, 1024).reshape(-1, 4, 256)
    n = len(K); pos = np.arange(n, dtype=np.float64)
    m = K[1:].mean(0)  # BOS excluded
    mx = load(d1, 'Kcur', il, 256)[1:].mean(0) if d1 else m
    mp_pre = rope(K[1:], pos[1:], il, -1).mean(0); Mp = rope(np.tile(mp_pre, (n, 1)), pos, il, +1)
    # oracle per-RoPE-pair rescale k/D, q*D with D^2 = rms(k pair)/rms(q pair): attention-exact, minimises |Dq||k/D|
    rk = np.sqrt(((K - m) ** 2).mean(0)); rk = np.sqrt((rk[:128] ** 2 + rk[128:] ** 2) / 2)
    rq = np.sqrt((Q ** 2).mean((0, 1))); rq = np.sqrt((rq[:128] ** 2 + rq[128:] ** 2) / 2)
    Dv = np.where((rk > 0) & (rq > 0), np.sqrt(rk / np.where(rq > 0, rq, 1)), 1.0); Dv = np.concatenate([Dv, Dv])
    # weight-only variant: same formula from the learned k/q norm gains (no activations needed)
    gk = np.sqrt((GK[il][:128] ** 2 + GK[il][128:] ** 2) / 2); gq = np.sqrt((GQ[il][:128] ** 2 + GQ[il][128:] ** 2) / 2)
    Gv = np.where((gk > 0) & (gq > 0), np.sqrt(gk / np.where(gq > 0, gq, 1)), 1.0); Gv = np.concatenate([Gv, Gv])
    qi = np.sort(rng.choice(np.arange(512, n), 384, replace=False))
    j = np.arange(n)
    mask = j[None] > qi[:, None]
    if il not in GLOB:
        mask |= j[None] <= qi[:, None] - 512
    def att(Kx):
        S = np.einsum('qhd,kd->qhk', Q[qi], Kx) / 16
        S = np.where(mask[:, None], -np.inf, S)
        return S, softmax(S.reshape(-1, n)).reshape(S.shape)
    S, P = att(K); O = P @ V
    valid = ~np.broadcast_to(mask[:, None], S.shape)
    sig = np.mean([S[a, h][valid[a, h]].std() for a in range(len(qi)) for h in range(4)])
    out = [f'{sig:.2f}']
    for kind, tag in KV:
        off = {'k': 0, 'm': m, 'mx': mx, 'mp': Mp, 'Dm': m, 'Dmp': Mp, 'Gm': m, 'G': 0, 'Gmx': mx, 'Gmp': Mp}[tag]
        Dx = Dv if tag.startswith('D') else Gv if tag.startswith('G') else 1.0
        Kh = Dx * quant((K - off) / Dx, kind) + off
        Sh, Ph = att(Kh)
        e = (Sh - S)[valid].std()
        kl = np.sum(P * (np.log(P + 1e-30) - np.log(Ph + 1e-30)), -1).mean()
        oe = ((Ph @ V - O) ** 2).sum() / (O ** 2).sum()
        out.append(f'{e:.2f} / {kl:.3f} / {oe:.4f}')
        tot.setdefault(f'K {kind}({tag})', []).append((kl, oe))
    for kind in VV:
        oe = ((P @ quant(V, kind) - O) ** 2).sum() / (O ** 2).sum()
        out.append(f'{oe:.4f}')
        tot.setdefault(f'V {kind}', []).append((0, oe))
    print(f'| {il} | ' + ' | '.join(out) + ' |', flush=True)
print('\nmean over 18 layers (KL, relative attention-output error):')
for k, v in tot.items():
    v = np.array(v); print(f'  {k}: KL {v[:, 0].mean():.4f}, out_err {v[:, 1].mean():.4f}')
