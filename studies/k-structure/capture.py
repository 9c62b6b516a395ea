#!/usr/bin/env python3
"""Capture post-RoPE K/V cache rows from a running llama-server (-ctk f16 -ctv f16 -fa on
--slot-save-path DIR) for a slice of the Jargon File, parse the slot file, save npz.

usage: capture.py PORT SLOTDIR OFFSET NCHARS OUT.npz
File layout (pinned llama.cpp, llama_state_seq_save_file + llama_kv_cache::state_write):
  u32 magic, u32 version, u32 n_tok, i32 tok[n_tok], then per cache (iSWA: base then swa):
  u32 n_stream; per stream: u32 cell_count; cells: (i32 pos, u32 n_seq, i32 seq[n_seq]);
  u32 v_trans, u32 n_layer; per layer (i32 type, u64 row_size, rows); same for V if !v_trans.
"""
import gzip, json, struct, sys, urllib.request
import numpy as np

port, slotdir, off, nch, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
text = gzip.open('/usr/share/doc/jargon-text/jargon.txt.gz', 'rt', errors='replace').read()[off:off + nch]

def post(path, body):
    req = urllib.request.Request(f'http://127.0.0.1:{port}{path}', json.dumps(body).encode(),
                                 {'Content-Type': 'application/json'})
    return json.loads(urllib.request.urlopen(req, timeout=1200).read())

r = post('/completion', {'prompt': text, 'n_predict': 1, 'cache_prompt': True, 'temperature': 0})
print('prompt tokens', r.get('tokens_evaluated'), file=sys.stderr)
post('/slots/0?action=save', {'filename': 'cap.bin'})
buf = open(f'{slotdir}/cap.bin', 'rb').read()

p = 0
def rd(fmt):
    global p
    v = struct.unpack_from(fmt, buf, p); p += struct.calcsize(fmt)
    return v if len(v) > 1 else v[0]

magic, ver, ntok = rd('<III')
toks = np.frombuffer(buf, np.int32, ntok, p); p += 4 * ntok
caches = []
while p < len(buf):
    nstream = rd('<I')
    for s in range(nstream):
        cc = rd('<I')
        if cc == 0:
            continue
        pos = []
        for _ in range(cc):
            ps, ns = rd('<iI'); p += 4 * ns; pos.append(ps)
        vtr, nl = rd('<II')
        assert vtr == 0
        K, V = [], []
        for dst in (K, V):
            for _ in range(nl):
                t, rs = rd('<iQ'); assert t == 1, t  # GGML_TYPE_F16
                dst.append(np.frombuffer(buf, np.float16, cc * rs // 2, p).reshape(cc, rs // 2).astype(np.float32))
                p += cc * rs
        caches.append((np.array(pos), np.stack(K), np.stack(V)))
assert p == len(buf)
# gemma3: layers 5,11,17 global (base cache), others SWA
glob = [5, 11, 17]; swa = [i for i in range(18) if i not in glob]
res = {'tokens': toks}  # note: in this build the first 3 int32 words are (-1, 1, n_tokens), then the ids (BOS=2 first)
(pb, Kb, Vb), (ps_, Ks, Vs) = caches
for j, il in enumerate(glob):
    res[f'K{il}'], res[f'V{il}'], res[f'pos{il}'] = Kb[j], Vb[j], pb
for j, il in enumerate(swa):
    res[f'K{il}'], res[f'V{il}'], res[f'pos{il}'] = Ks[j], Vs[j], ps_
np.savez_compressed(out, **res)
print('saved', out, 'base cells', len(pb), 'swa cells', len(ps_), 'n_layer', Kb.shape[0], Ks.shape[0], file=sys.stderr)
