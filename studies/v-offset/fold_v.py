# fold a per-layer value offset m into a Qwen2 GGUF: b_v := b_v - m, attn_output.bias := W_o m (m repeated over
# each KV head's query heads). Exact for attention (o = sum_i p_i (v_i - m) + m since sum_i p_i = 1), so the cache
# stores v - m. Needs a llama.cpp whose qwen2 loader takes an optional attn_output.bias (study build, see README).
#   GGUF_PY=<prepared tree>/gguf-py fold_v.py IN.gguf OUT.gguf MODE [DUMP.bin]
#   MODE: mean  (mean value of the dump's tokens, per KV head)
#         wmean (sum_j w_j v_j / sum_j w_j, w_j = sum_i p_ij^2 from the dump's causal attention: the offset that
#                minimises the output error for independent per-token errors; weights the attention sink)
#         bv    (m = b_v: the stored bias becomes 0)
#         zero  (m = 0 but an all-zero attn_output.bias is added: the loader/graph check)
import sys, os, struct, numpy as np
sys.path.insert(0, os.environ['GGUF_PY'])
import gguf
from gguf import GGUFReader, GGUFWriter, GGUFValueType, GGMLQuantizationType
from gguf.quants import dequantize
src, dst, mode = sys.argv[1], sys.argv[2], sys.argv[3]
r = GGUFReader(src)
T = {t.name: t for t in r.tensors}
arch = r.fields['general.architecture'].contents()
nl = r.fields[f'{arch}.block_count'].contents()
nh = r.fields[f'{arch}.attention.head_count'].contents(); nkv = r.fields[f'{arch}.attention.head_count_kv'].contents()
deq = lambda t: dequantize(t.data, t.tensor_type).astype(np.float32)
d = {}
if mode in ('mean', 'wmean'):
    with open(sys.argv[4], 'rb') as f:
        n, = struct.unpack('i', f.read(4))
        for _ in range(n):
            L, = struct.unpack('i', f.read(4)); name = f.read(L).decode()
            ne = struct.unpack('4q', f.read(32)); cnt = int(np.prod(ne))
            d[name] = np.frombuffer(f.read(4 * cnt), np.float32).reshape(ne[::-1])
M, BO = {}, {}
for il in range(nl):
    bv = deq(T[f'blk.{il}.attn_v.bias']).reshape(nkv, -1); hd = bv.shape[1]; g = nh // nkv
    if mode == 'mean': m = d[f'Vcur-{il}'][0].mean(0)
    elif mode == 'wmean':
        q = d[f'Qcur-{il}'][0].astype(np.float64); k = np.repeat(d[f'Kcur-{il}'][0].astype(np.float64), g, 1)
        v = d[f'Vcur-{il}'][0].astype(np.float64); n = v.shape[0]
        s = np.einsum('ihd,jhd->hij', q, k) / np.sqrt(hd)
        s = np.where(np.tril(np.ones((n, n), bool))[None], s, -np.inf)
        P = np.exp(s - s.max(-1, keepdims=True)); P /= P.sum(-1, keepdims=True)
        w = (P ** 2).sum(1).reshape(nkv, g, n).sum(1)
        m = np.einsum('hj,jhd->hd', w, v) / w.sum(-1, keepdims=True)
    elif mode == 'bv': m = bv.copy()
    else: m = np.zeros_like(bv)
    m = m.astype(np.float32)
    M[il] = (bv - m).reshape(-1)
    Wo = deq(T[f'blk.{il}.attn_output.weight'])           # [n_embd out, n_embd in]
    BO[il] = (Wo.astype(np.float64) @ np.repeat(m, g, 0).reshape(-1).astype(np.float64)).astype(np.float32)
    print(f"layer {il:2d}: |m| {np.linalg.norm(m):.3f}  |b_v| {np.linalg.norm(bv):.3f}  |b_v - m| {np.linalg.norm(bv - m):.3f}  |W_o m| {np.linalg.norm(BO[il]):.3f}")
w = GGUFWriter(dst, arch=arch)
for field in r.fields.values():
    if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith('GGUF.'): continue
    vt = field.types[0]; st = field.types[-1] if vt == GGUFValueType.ARRAY else None
    w.add_key_value(field.name, field.contents(), vt, sub_type=st)
out = []
for t in r.tensors:
    if t.name.endswith('attn_v.bias'):
        il = int(t.name.split('.')[1]); a = M[il].astype(t.data.dtype).reshape(t.data.shape)
    else: a = t.data
    out.append((t.name, a, t.tensor_type))
    if t.name.endswith('attn_output.weight'):
        il = int(t.name.split('.')[1]); out.append((f'blk.{il}.attn_output.bias', BO[il], GGMLQuantizationType.F32))
for name, a, ty in out: w.add_tensor_info(name, a.shape, a.dtype, a.nbytes, ty)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_ti_data_to_file()
for name, a, ty in out: w.write_tensor_data(a, tensor_endianess=r.endianess)
w.close()
print(f"{mode}: folded a value offset into {nl} layers -> {dst}")
