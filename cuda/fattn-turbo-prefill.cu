// turbo-llama: flash-attention prefill (batches above the fused decode kernel's) with turbo K and/or V,
// through upstream's f16 kernels in the rotated domain (DESIGN.md §2).
//
// Why: the generic path decodes the whole turbo cache to f16 for every ubatch, and each decoded 128-block
// needs an inverse FWHT. Attention does not need the original domain: with R the encoder's orthonormal
// rotation, q.k = (R q).(R k) and sum p v = R^-1 sum p (R v). So here K and V are decoded to f16 in the
// rotated domain (norm x centroid, no transform), q is rotated once (a few rows), upstream's kernel runs on
// f16 K/V, and the output rows are rotated back once.
// Opt-in (TURBO_FA_PREFILL=1): on the H200 it passed every FLASH_ATTN_EXT case but was not faster than the
// generic conversion (pp512 @32K 0.855x f16 against 0.902x, results/gpu.md run 5), so the default stays generic.
#include "turbo-common.cuh"
#include "turbo.cuh"
#include "fattn.cuh"

// q rows (strided f32) -> contiguous rows of R q: signs, FWHT, 1/sqrt(128); one warp per 128-block
static __global__ void k_turbo_rotate_rows(const char * __restrict__ src, float * __restrict__ dst, const int64_t ne0,
        const int64_t ne1, const int64_t ne2, const size_t nb1, const size_t nb2, const size_t nb3) {
    const int lane = threadIdx.x;
    const int64_t row = blockIdx.x;
    const int64_t i1 = row % ne1, i2 = (row / ne1) % ne2, i3 = row / (ne1*ne2);
    const int b = blockIdx.y;
    const float * s = (const float *) (src + i1*nb1 + i2*nb2 + i3*nb3) + b*QK_TURBO;
    float v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int i = lane + 32*k;
        v[k] = turbo_sign_neg(i) ? -s[i] : s[i];
    }
    turbo_warp_fwht(v, lane);
    float * d = dst + row*ne0 + b*QK_TURBO;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        d[lane + 32*k] = v[k]*TURBO_CUDA_INV_SQRT_QK;
    }
}

// contiguous f32 rows in place: R^-1 = FWHT, 1/sqrt(128), signs
static __global__ void k_turbo_unrotate_rows(float * __restrict__ x, const int64_t ne0) {
    const int lane = threadIdx.x;
    float * r = x + (int64_t) blockIdx.x*ne0 + blockIdx.y*QK_TURBO;
    float v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        v[k] = r[lane + 32*k];
    }
    turbo_warp_fwht(v, lane);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int i = lane + 32*k;
        const float y = v[k]*TURBO_CUDA_INV_SQRT_QK;
        r[i] = turbo_sign_neg(i) ? -y : y;
    }
}

// turbo rows (strided) -> contiguous f16 rows in the rotated domain: norm x centroid; 128 threads per row
template <int bits>
static __global__ void k_turbo_decode_rotated_f16(const char * __restrict__ src, half * __restrict__ dst, const int64_t ne0,
        const int64_t ne1, const int64_t ne2, const size_t nb1, const size_t nb2, const size_t nb3) {
    constexpr int BS = bits == 3 ? 50 : 34;
    const int64_t row = blockIdx.x;
    const int64_t i1 = row % ne1, i2 = (row / ne1) % ne2, i3 = row / (ne1*ne2);
    const uint8_t * r = (const uint8_t *) (src + i1*nb1 + i2*nb2 + i3*nb3);
    half * d = dst + row*ne0;
    const int i = threadIdx.x;
    for (int b = 0; b < ne0/QK_TURBO; ++b) {
        const uint8_t * blk = r + b*BS;
        const float norm = __half2float(*(const half *) blk);
        const uint8_t * qs = blk + 2;
        int c = (qs[i >> 2] >> (2*(i & 3))) & 3;
        if (bits == 3) {
            c |= ((qs[32 + (i >> 3)] >> (i & 7)) & 1) << 2;
        }
        d[b*QK_TURBO + i] = __float2half(norm*turbo_centroid(bits, c));
    }
}

// t as a contiguous tensor of `type` at data (no view)
static ggml_tensor turbo_contiguous_like(const ggml_tensor * t, const ggml_type type, void * data) {
    ggml_tensor r = *t;
    r.type = type;
    r.data = data;
    r.view_src = nullptr;
    r.view_offs = 0;
    r.nb[0] = ggml_type_size(type);
    for (int i = 1; i < GGML_MAX_DIMS; ++i) {
        r.nb[i] = r.nb[i - 1]*r.ne[i - 1];
    }
    return r;
}

static void turbo_decode_rotated(cudaStream_t stream, const ggml_tensor * t, half * out) {
    const dim3 grid((unsigned) (t->ne[1]*t->ne[2]*t->ne[3]));
    if (t->type == GGML_TYPE_TURBO3) {
        k_turbo_decode_rotated_f16<3><<<grid, QK_TURBO, 0, stream>>>((const char *) t->data, out, t->ne[0], t->ne[1], t->ne[2], t->nb[1], t->nb[2], t->nb[3]);
    } else {
        k_turbo_decode_rotated_f16<2><<<grid, QK_TURBO, 0, stream>>>((const char *) t->data, out, t->ne[0], t->ne[1], t->ne[2], t->nb[1], t->nb[2], t->nb[3]);
    }
}

bool ggml_cuda_turbo_fattn_prefill(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * Q = dst->src[0];
    const ggml_tensor * K = dst->src[1];
    const ggml_tensor * V = dst->src[2];
    const bool K_turbo = ggml_cuda_is_turbo_type(K->type), V_turbo = ggml_cuda_is_turbo_type(V->type);
    if ((!K_turbo && !V_turbo) || Q->ne[1] <= GGML_CUDA_TURBO_FA_MAX_BATCH) {
        return false;
    }
    static const bool enabled = ggml_cuda_turbo_env_int("TURBO_FA_PREFILL", 0) != 0;
    if (!enabled || !ggml_cuda_turbo_fattn_pair_supported(dst) || !ggml_is_contiguous(dst) || Q->type != GGML_TYPE_F32) {
        return false;
    }
    ggml_cuda_turbo_check_tables();
    cudaStream_t stream = ctx.stream();
    ggml_cuda_pool & pool = ctx.pool();
    const int64_t D = Q->ne[0];

    ggml_cuda_pool_alloc<float> q_rot(pool);
    ggml_cuda_pool_alloc<half>  k_rot(pool), v_rot(pool);
    ggml_tensor Qr = *Q, Kr = *K, Vr = *V;
    if (K_turbo) {
        q_rot.alloc(ggml_nelements(Q));
        const dim3 grid((unsigned) (Q->ne[1]*Q->ne[2]*Q->ne[3]), (unsigned) (D/QK_TURBO));
        k_turbo_rotate_rows<<<grid, WARP_SIZE, 0, stream>>>((const char *) Q->data, q_rot.ptr, D, Q->ne[1], Q->ne[2], Q->nb[1], Q->nb[2], Q->nb[3]);
        Qr = turbo_contiguous_like(Q, GGML_TYPE_F32, q_rot.ptr);
        k_rot.alloc(ggml_nelements(K));
        turbo_decode_rotated(stream, K, k_rot.ptr);
        Kr = turbo_contiguous_like(K, GGML_TYPE_F16, k_rot.ptr);
    }
    if (V_turbo) {
        v_rot.alloc(ggml_nelements(V));
        turbo_decode_rotated(stream, V, v_rot.ptr);
        Vr = turbo_contiguous_like(V, GGML_TYPE_F16, v_rot.ptr);
    }
    CUDA_CHECK(cudaGetLastError());

    ggml_tensor dst_r = *dst;   // writes dst's data; K and V are no longer turbo: upstream's dispatch
    dst_r.src[0] = &Qr;
    dst_r.src[1] = &Kr;
    dst_r.src[2] = &Vr;
    ggml_cuda_flash_attn_ext(ctx, &dst_r);

    if (V_turbo) {
        const dim3 grid((unsigned) (ggml_nelements(dst)/D), (unsigned) (D/QK_TURBO));
        k_turbo_unrotate_rows<<<grid, WARP_SIZE, 0, stream>>>((float *) dst->data, D);
        CUDA_CHECK(cudaGetLastError());
    }
    return true;
}
