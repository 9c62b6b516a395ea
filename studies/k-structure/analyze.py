#!/usr/bin/env python3
"""Structure of Gemma 3 270M post-RoPE K cache and what it means for turbo3/turbo2/q4_0 K error.
usage: analyze.py capA.npz [capB.npz ...]   (files from capture.py)"""
import sys
import numpy as np
sys.path.insert(0, __file__.rsplit('/', 1)[0])
from kcommon import *  # noqa: F401,F403

rng = np.random.default_rng(0)
caps = [np.load(f) for f in sys.argv[1:]]
KINDS = ['turbo3', 'turbo2', 'q4_0H', 'q4_0']
rows = []
print('## per layer (all captures pooled; means are per capture)')
print('| L | kind | n | RMS|k| | pos0 |k|/RMS | E_mean/E (post-RoPE) | E_mean/E (pre-RoPE mean, re-rotated) | top-8 ch share of E | ' +
      ' | '.join(f'{k} err/E: k, k-m, k-m_p' for k in KINDS) + ' |')
print('|' + '---|' * (7 + len(KINDS)))
summ = {}
for il in range(18):
    acc = {}
    for c in caps:
        K = c[f'K{il}'].astype(np.float64); pos = c[f'pos{il}'].astype(np.float64)
        o = np.argsort(pos); K, pos = K[o], pos[o]
        E = (K ** 2).sum(1)
        acc.setdefault('pos0', []).append(np.sqrt(E[0] / E.mean()) if pos[0] == 0 else np.nan)
        if pos[0] == 0:  # drop BOS (position 0) from all statistics: it is special
            K, pos, E = K[1:], pos[1:], E[1:]
        m = K.mean(0)
        Kp = rope(K, pos, il, -1)           # back to pre-RoPE frame
        mp = Kp.mean(0); Mp = rope(np.tile(mp, (len(pos), 1)), pos, il, +1)
        R0, R1 = K - m, K - Mp
        for key, val in [('E', E.sum()), ('Em', (m ** 2).sum() * len(K)), ('Emp', (Mp ** 2).sum()),
                         ('R0', (R0 ** 2).sum()), ('R1', (R1 ** 2).sum()),
                         ('ch', np.sort((K ** 2).sum(0))[-8:].sum()), ('n', len(K))]:
            acc[key] = acc.get(key, 0) + val
        for kind in KINDS:
            for tag, X, off in [('k', K, 0), ('m', R0, m), ('mp', R1, Mp)]:
                err = ((quant(X, kind) + off - K) ** 2).sum()
                acc[kind + tag] = acc.get(kind + tag, 0) + err
        acc.setdefault('data', []).append((K, pos, m, Mp))
    E = acc['E']
    r = dict(L=il, kind='G' if il in GLOB else 'S', n=acc['n'], rms=np.sqrt(E / acc['n']),
             fm=1 - acc['R0'] / E, fmp=1 - acc['R1'] / E, ch=acc['ch'] / E,
             **{k + t: acc[k + t] / E for k in KINDS for t in ('k', 'm', 'mp')})
    summ[il] = (r, acc['data'])
    print(f"| {il} | {r['kind']} | {r['n']} | {r['rms']:.1f} | {(np.nanmean(acc['pos0']) if np.isfinite(acc['pos0']).any() else np.nan):.2f} | {r['fm']:.3f} | {r['fmp']:.3f} | {r['ch']:.3f} | " +
          ' | '.join(f"{r[k+'k']:.4f}, {r[k+'m']:.4f}, {r[k+'mp']:.4f}" for k in KINDS) + ' |')

# per channel-pair view of the mean: energy of the mean by RoPE pair, with the pair's period
print('\n## where the mean sits (first capture): top RoPE pairs (i, i+128) by share of E in the post-RoPE mean vs pre-RoPE mean')
for il in [0, 5, 11, 17]:
    K, pos, m, Mp = summ[il][1][0]
    E = (K ** 2).sum(1).mean()
    pe = (m[:HALF] ** 2 + m[HALF:] ** 2) / E
    mp = rope(Mp, pos, il, -1)[0]; ppe = (mp[:HALF] ** 2 + mp[HALF:] ** 2) / E
    top = np.argsort(-ppe)[:5]
    per = 2 * np.pi / theta(il)
    print(f'L{il}: ' + ', '.join(f'pair {i} (period {per[i]:.3g} tok): post {pe[i]:.3f} pre {ppe[i]:.3f}' for i in top))

# attention proxies
print('\n## attention proxies (logit = q.k/16; error = q.(khat-k)/16)')
print('P1: q = g_q (.) z, z~N(0,I) (RMS-normed query with the layer\'s learned q-norm gains, random direction), RoPE at the last position;')
print('    sd_sig = std over keys of the logit, sd_err = std of logit error, KL = mean KL(p||p_hat) over 256 queries, all keys of the window')
print('P2: keys as queries: q_i = k_i (the real cached key at a later position i), causal over the window, 256 query positions')
VARS = [('turbo3', 'k'), ('turbo3', 'm'), ('turbo3', 'mp'), ('turbo3', 'D'), ('turbo3', 'Dmp'), ('turbo2', 'k'), ('turbo2', 'm'), ('turbo2', 'mp'), ('q4_0H', 'k'), ('q4_0H', 'm')]
V2 = [('turbo3', 'k'), ('turbo3', 'm'), ('turbo3', 'mp'), ('q4_0H', 'k'), ('q4_0H', 'm')]
t1, t2 = [], []
agg = {}
for il in range(18):
    K, pos, m, Mp = summ[il][1][0]
    n = len(K)
    KH = {}
    for kind, tag in VARS:
        Dv = dscale(il) if 'D' in tag else np.ones(D)
        off = m if tag.endswith('m') else Mp if tag.endswith('mp') else 0
        KH[(kind, tag)] = Dv * quant((K - off) / Dv, kind) + off
    # P1
    z = rng.standard_normal((256, D)); Q = GQ[il][None] * z
    Q = rope(Q, np.full(256, pos[-1]), il, +1)
    S = Q @ K.T * SCALE; P = softmax(S)
    out = [f'{S.std(1).mean():.2f}']
    for v in VARS:
        Sh = Q @ KH[v].T * SCALE
        out.append(f'{(Sh - S).std():.2f} / {kl(P, softmax(Sh)):.3f}')
        agg.setdefault(('P1',) + v, []).append(kl(P, softmax(Sh)))
    t1.append(f'| {il} | ' + ' | '.join(out) + ' |')
    # P2 (causal)
    qi = np.sort(rng.choice(np.arange(n // 4, n), 256, replace=False))
    Q2 = K[qi]; S = Q2 @ K.T * SCALE
    mask = np.arange(n)[None] > qi[:, None]
    if il not in GLOB:
        mask |= np.arange(n)[None] <= qi[:, None] - 512
    S = np.where(mask, -np.inf, S); P = softmax(S)
    sig = np.mean([S[a][~mask[a]].std() for a in range(256)])
    out = [f'{sig:.1f}']
    for v in V2:
        Sh = np.where(mask, -np.inf, Q2 @ KH[v].T * SCALE)
        d = (Sh - S)[~mask]
        out.append(f'{d.std():.2f} / {kl(P, softmax(Sh)):.4f}')
        agg.setdefault(('P2',) + v, []).append(kl(P, softmax(Sh)))
    t2.append(f'| {il} | ' + ' | '.join(out) + ' |')
print('\nP1 (tags: k = plain, m = k - mean, mp = k - position-rotated pre-RoPE mean, D = per-pair weight-derived rescale, Dmp = both)')
print('| L | sd_sig | ' + ' | '.join(f'{a}({b}) sd_err / KL' for a, b in VARS) + ' |')
print('|' + '---|' * (2 + len(VARS)))
print('\n'.join(t1))
print('\nP2')
print('| L | sd_sig | ' + ' | '.join(f'{a}({b}) sd_err / KL' for a, b in V2) + ' |')
print('|' + '---|' * (2 + len(V2)))
print('\n'.join(t2))
print('\nmean KL over layers:\n' + '\n'.join(f'{p} {a}({b}) {np.mean(x):.4f}' for (p, a, b), x in agg.items()))
