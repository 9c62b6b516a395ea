"""SmolLM2-135M (llama, head_dim 64) with a synthetic Qwen2-like key bias: a large constant on each head's slowest
RoPE pairs (NORM pairs 28-31, dims 56-63), B times the estimated rms of that key channel. Study input only."""
import sys, numpy as np, gguf
src, dst, B = sys.argv[1], sys.argv[2], float(sys.argv[3])
r = gguf.GGUFReader(src)
arch = 'llama'
w = gguf.GGUFWriter(dst, arch)
for f in r.fields.values():
    if f.name.startswith('GGUF.') or f.name == 'general.architecture':
        continue
    t = f.types[0]
    if t == gguf.GGUFValueType.ARRAY:
        sub = f.types[-1]
        if sub == gguf.GGUFValueType.STRING:
            val = [bytes(f.parts[i]).decode('utf-8', 'replace') for i in f.data]
        else:
            val = [f.parts[i].tolist()[0] for i in f.data]
        w.add_key_value(f.name, val, t, sub_type=sub)
    elif t == gguf.GGUFValueType.STRING:
        w.add_key_value(f.name, bytes(f.parts[f.data[0]]).decode('utf-8', 'replace'), t)
    else:
        w.add_key_value(f.name, f.parts[f.data[0]].tolist()[0], t)
tens = {t.name: t for t in r.tensors}
n_layer = r.fields['llama.block_count'].parts[-1][0]
hd = 64
for t in r.tensors:
    w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
for il in range(n_layer):
    wk = tens[f'blk.{il}.attn_k.weight']; g = tens[f'blk.{il}.attn_norm.weight']
    W = gguf.quants.dequantize(wk.data, wk.tensor_type).reshape(-1, int(wk.shape[0]))   # [n_embd_k, n_embd]
    rms = np.sqrt(((W * np.asarray(g.data, np.float32)[None, :])**2).sum(1))
    b = np.zeros(W.shape[0], np.float32)
    for h in range(W.shape[0] // hd):
        for d in range(56, 64):
            i = h*hd + d
            b[i] = B * rms[i] * (1 if (d + h + il) % 3 else -1)
    w.add_tensor(f'blk.{il}.attn_k.bias', b)
    if il == 0: print('layer 0 mean channel rms %.3f, bias |b| on 8 dims/head: %.3f' % (rms.mean(), np.abs(b[b != 0]).mean()))
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
print('wrote', dst)
