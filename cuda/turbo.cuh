// turbo-llama: CUDA entry points for the turbo KV-cache types, both block sizes (kernels in turbo.cu, fattn-turbo*.cu).
// Included by the hooked upstream files (patches/b11312/*-cuda-*.patch).
#pragma once

#include "common.cuh"
#include "convert.cuh"
#include "ggml-turbo.h"

#include <utility>

// The turbo kernels are launched plainly, not with programmatic dependent launch as upstream b11312 launches most
// of its own (ggml_cuda_kernel_launch): it measured no gain for the turbo kernels and a loss at long contexts. The
// kernels still call ggml_cuda_pdl_lc early, so that upstream's next
// kernel, launched with PDL, may start while they drain (its ggml_cuda_pdl_sync waits for their writes).
template <typename Kernel, typename... Args>
static void ggml_cuda_turbo_launch(Kernel kernel, const dim3 grid, const dim3 block, cudaStream_t stream, Args &&... args) {
    kernel<<<grid, block, 0, stream>>>(std::forward<Args>(args)...);
}

// the values of one block of a turbo type: QK_TURBO, or QK_TURBO_64 for the 64-value forms of head_dim 64 models; 0 for
// any other type. The one test of "is it turbo, and which block size" for host and device code alike
static constexpr __host__ __device__ int ggml_cuda_turbo_qk(const ggml_type t) {
    return t == GGML_TYPE_TURBO3    || t == GGML_TYPE_TURBO2    || t == GGML_TYPE_TURBO4    ? QK_TURBO    :
           t == GGML_TYPE_TURBO3_64 || t == GGML_TYPE_TURBO2_64 || t == GGML_TYPE_TURBO4_64 ? QK_TURBO_64 : 0;
}
// any turbo type: what the hooks in upstream's files route to the entry points below, which serve both block sizes
static constexpr __host__ __device__ bool ggml_cuda_is_turbo_type(const ggml_type t) {
    return ggml_cuda_turbo_qk(t) != 0;
}

// ggml_backend_cuda_device_supports_op for an op on a turbo type: 1 or 0, or -1 when the op is upstream's to judge
int ggml_cuda_turbo_supports_op(const ggml_tensor * op);

// write path: SET_ROWS (src0 f32 or f16) into a turbo tensor (either block size); CPY f32/f16 -> turbo and turbo -> f32/f16
void ggml_cuda_turbo_set_rows(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
// the recent window of a SET_ROWS (ggml_set_rows_ring, src[4]): whether the kernels take it (true without one); for a
// non-turbo destination the copy of the rows just stored into it, called after upstream's SET_ROWS (no-op without one;
// a turbo write stores its ring rows, rotated and as q8_0, itself)
bool ggml_cuda_turbo_set_rows_ring_ok(const ggml_tensor * dst);
void ggml_cuda_turbo_set_rows_ring(ggml_backend_cuda_context & ctx, const ggml_tensor * dst);
// SUB (one f32 row, broadcast) then SET_ROWS into a turbo tensor, as one kernel (llama's turbo key offset)
bool ggml_cuda_turbo_set_rows_sub_fusable(const ggml_tensor * sub, const ggml_tensor * set_rows);
void ggml_cuda_turbo_set_rows_sub(ggml_backend_cuda_context & ctx, const ggml_tensor * sub, ggml_tensor * set_rows);
// ... and the V write that follows it (SET_ROWS of f32 rows into a turbo tensor), all in one launch; with rope,
// K's ROPE -> VIEW before the SUB too (set_rows_v may then be nullptr)
bool ggml_cuda_turbo_set_rows_pair_fusable(const ggml_tensor * set_rows_k, const ggml_tensor * set_rows_v);
bool ggml_cuda_turbo_rope_set_rows_fusable(const ggml_tensor * rope, const ggml_tensor * view, const ggml_tensor * sub);
bool ggml_cuda_turbo_rope_on_load_ok(const ggml_tensor * rope);   // a ROPE that turbo_rope_block can do on load
void ggml_cuda_turbo_set_rows_sub_pair(ggml_backend_cuda_context & ctx, const ggml_tensor * sub, ggml_tensor * set_rows_k,
        ggml_tensor * set_rows_v, const ggml_tensor * rope = nullptr, const ggml_tensor * mul = nullptr);
// llama's q*D and k/D (patch 0041) before the RoPE that a fused kernel does on load: a MUL (node i) by a contiguous
// f32 row of the head's width, broadcast over heads and tokens, whose one consumer is the ROPE after it (only views
// between). Gives how many nodes after the MUL that ROPE is, or 0; the fused kernels then read the MUL's input and
// multiply as they load (turbo_rope::mul), passed as their mul argument
int ggml_cuda_turbo_rope_mul_fusable(const ggml_cgraph * cgraph, int i);
void ggml_cuda_turbo_cpy(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, ggml_tensor * src1);
bool ggml_cuda_turbo_cpy_supported(const ggml_tensor * src0, const ggml_tensor * src1);

// read path: GET_ROWS (dst f32 or f16), conversions for ggml_get_to_*_cuda (nullptr for other types)
void ggml_cuda_turbo_get_rows(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
to_fp16_cuda_t    ggml_cuda_turbo_get_to_fp16(ggml_type type);
to_fp32_cuda_t    ggml_cuda_turbo_get_to_fp32(ggml_type type);
to_fp16_nc_cuda_t ggml_cuda_turbo_get_to_fp16_nc(ggml_type type);
to_fp32_nc_cuda_t ggml_cuda_turbo_get_to_fp32_nc(ggml_type type);

// flash attention decode (Q->ne[1] <= GGML_CUDA_TURBO_FA_MAX_BATCH) with turbo K and/or V, in the rotated domain
#define GGML_CUDA_TURBO_FA_MAX_BATCH 8
bool ggml_cuda_turbo_fattn_pair_supported(const ggml_tensor * dst);
// fattn.cu's choice of kernel for an op with turbo K and/or V: 1 the fused decode (decode batches: no f16 copy of the
// cache), -1 none (a pair or head size the turbo kernels do not take), 0 upstream's choice (larger batches, converted
// to f16; not a turbo op)
int ggml_cuda_turbo_fattn_route(const ggml_tensor * dst);
// whether the op has cell 0's exact rows for a turbo K or V (ggml_flash_attn_ext_set_cell0): the turbo kernels take them
bool ggml_cuda_turbo_fattn_has_cell0(const ggml_tensor * dst);
// whether it has the recent window's ring rows (ggml_flash_attn_ext_set_ring: src[7..9]): the turbo kernels take them
bool ggml_cuda_turbo_fattn_has_ring(const ggml_tensor * dst);
bool ggml_cuda_turbo_fattn_ring_ok(const ggml_tensor * dst);   // the ring's tensors as the kernels take them (true: none)
void ggml_cuda_flash_attn_ext_turbo(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
// llama's ROPE of Q done by the decode attention kernel on load: the fusable check gives
// how many nodes after the ROPE (node i) the attention node sits, or 0
int ggml_cuda_turbo_rope_fa_fusable(const ggml_cgraph * cgraph, int i);
void ggml_cuda_turbo_rope_fa(ggml_backend_cuda_context & ctx, const ggml_tensor * rope, ggml_tensor * fa,
        const ggml_tensor * mul = nullptr);
// flash attention with a 64-value turbo K or V (fattn-turbo-prefill.cu, the prefill's kernels at that block size): through
// upstream's f16 kernels in the rotated domain at every batch size, q8_0 / f16 partners converted there too
bool ggml_cuda_turbo64_fattn_supported(const ggml_tensor * dst);
void ggml_cuda_turbo64_fattn(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
// ... except the decode of _64 K and V at head size 64, which the tensor-core decode kernel takes (fattn-turbo.cu)
bool ggml_cuda_turbo64_fattn_fused(const ggml_tensor * dst);
// shared by the prefill and the 64-value attention (fattn-turbo-prefill.cu): cell 0's exact rows x (F32 [D, n_head_kv,
// ne3]; NaN rows skipped) over row 0 of each head of a decoded f16 cache shaped like t, and t as a contiguous tensor
// (rows: the rows of each head of out, t->ne[1] when 0 or less)
void ggml_cuda_turbo_cell0_f16(cudaStream_t stream, const ggml_tensor * x, const ggml_tensor * t, half * out, int64_t rows = 0);
ggml_tensor ggml_cuda_turbo_contiguous_like(const ggml_tensor * t, ggml_type type, void * data);
// prefill (larger batches) with turbo K and/or V through upstream's f16 kernels in the rotated domain;
// false when it does not apply (then the generic path converts the cache to f16)
bool ggml_cuda_turbo_fattn_prefill(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
