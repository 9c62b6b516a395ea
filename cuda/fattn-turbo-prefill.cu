// turbo-llama: flash-attention prefill (batches above the fused decode kernel's) with turbo K and/or V,
// through upstream's f16 kernels in the rotated domain (DESIGN.md §2).
//
// Why: the generic path decodes the whole turbo cache to f16 for every ubatch, and each decoded 128-block
// needs an inverse FWHT. Attention does not need the original domain: with R the encoder's orthonormal
// rotation, q.k = (R q).(R k) and sum p v = R^-1 sum p (R v). So here K and V are decoded to f16 in the
// rotated domain (norm x centroid, no transform), q is rotated once (a few rows), upstream's kernel runs on
// f16 K/V, and the output rows are rotated back once.
// The prefill path since run 9 (the generic conversion serves what this does not): with one warp per block in the
// decode below, a 512-query ubatch over 32K turbo3 keys costs 122 us per layer on top of the attention instead
// of 180 (pp512 @32K 0.960x f16 against 0.910x on the H200, results/gpu.md run 9); with 8 blocks per warp
// (run 15) the K or V decode takes 27 us instead of 54 and the op 1124.9 us instead of 1166.8 (f16: 997). Run
// 5's first version (a block per row) was slower than the generic path (0.855x against 0.902x).
#include "turbo-common.cuh"
#include "turbo.cuh"
#include "fattn.cuh"


// blocks of 8 warps (threadIdx.y); each warp takes TURBO_ROT_NB consecutive 128-blocks of the rows and issues
// all their loads before it computes: with one block per warp (runs 9-14) every warp was one load's latency
// and the kernels ran in ~30 short waves (the decode of a 32K turbo3 cache, 80 MB moved, took 53.6 us: 1.5 TB/s)
#define TURBO_ROT_WARPS 8
#define TURBO_ROT_NB    8

// the warps of a launch over nblk blocks, NB blocks each
static unsigned turbo_rot_grid(const int64_t nblk, const int nb) {
    return (unsigned) ((nblk + (int64_t) TURBO_ROT_WARPS*nb - 1) / ((int64_t) TURBO_ROT_WARPS*nb));
}

// the next block of a walk over (block of a row, dim 1, dim 2, dim 3): turbo_block_at(wid + 1) without divisions
static __device__ __forceinline__ void turbo_block_next(turbo_block_pos & b, const int nbr, const int ne1, const int ne2) {
    if (++b.ib == nbr) {
        b.ib = 0;
        if (++b.i1 == ne1) {
            b.i1 = 0;
            if (++b.i2 == ne2) {
                b.i2 = 0;
                ++b.i3;
            }
        }
    }
}

// q rows (strided f32) -> contiguous rows of R q: signs, FWHT, 1/sqrt(128)
template <int NB>
static __global__ void k_turbo_rotate_rows(const char * __restrict__ src, float * __restrict__ dst, const int64_t ne0,
        const int64_t ne1, const int64_t ne2, const size_t nb1, const size_t nb2, const size_t nb3, const int64_t nblk) {
    const int lane = threadIdx.x;
    const int64_t w0 = ((int64_t) blockIdx.x*TURBO_ROT_WARPS + threadIdx.y)*NB;
    if (w0 >= nblk) {
        return;
    }
    float v[NB][4];
#pragma unroll
    for (int j = 0; j < NB; ++j) {
        const int64_t wid = w0 + j < nblk ? w0 + j : nblk - 1;   // the tail repeats the last block, unstored
        const int64_t row = wid / (ne0/QK_TURBO);
        const int b = (int) (wid % (ne0/QK_TURBO));
        const int64_t i1 = row % ne1, i2 = (row / ne1) % ne2, i3 = row / (ne1*ne2);
        const float * s = (const float *) (src + i1*nb1 + i2*nb2 + i3*nb3) + b*QK_TURBO;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            v[j][k] = s[lane + 32*k];
        }
    }
#pragma unroll
    for (int j = 0; j < NB; ++j) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            v[j][k] = turbo_sign_neg(lane + 32*k) ? -v[j][k] : v[j][k];
        }
        turbo_warp_fwht(v[j], lane);
        if (w0 + j < nblk) {
            float * d = dst + (w0 + j)*QK_TURBO;   // rows of ne0 follow each other: block wid sits at wid*128
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                d[lane + 32*k] = v[j][k]*TURBO_CUDA_INV_SQRT_QK;
            }
        }
    }
}

// contiguous f32 rows in place: R^-1 = FWHT, 1/sqrt(128), signs
template <int NB>
static __global__ void k_turbo_unrotate_rows(float * __restrict__ x, const int64_t nblk) {
    const int lane = threadIdx.x;
    const int64_t w0 = ((int64_t) blockIdx.x*TURBO_ROT_WARPS + threadIdx.y)*NB;
    if (w0 >= nblk) {
        return;
    }
    float v[NB][4];
#pragma unroll
    for (int j = 0; j < NB; ++j) {
        const int64_t wid = w0 + j < nblk ? w0 + j : nblk - 1;   // contiguous rows: the 128-blocks follow each other
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            v[j][k] = x[wid*QK_TURBO + lane + 32*k];
        }
    }
#pragma unroll
    for (int j = 0; j < NB; ++j) {
        turbo_warp_fwht(v[j], lane);
        if (w0 + j < nblk) {
            float * r = x + (w0 + j)*QK_TURBO;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int i = lane + 32*k;
                const float y = v[j][k]*TURBO_CUDA_INV_SQRT_QK;
                r[i] = turbo_sign_neg(i) ? -y : y;
            }
        }
    }
}

// turbo blocks (strided rows) -> contiguous f16 rows in the rotated domain: norm x centroid, no transform.
// Per block, each lane 4 consecutive values: one byte of the low plane, a nibble of the high one, the centroids
// by shuffle from lanes 0..7, one 8-byte store (the warp writes the block's 256 bytes at once); NB blocks per warp.
// (The first version, a 128-thread block per row and one value per thread, was slower than the generic
// conversion with its FWHT: results/gpu.md, run 5.)
template <int bits, int NB>
static __global__ void k_turbo_decode_rotated_f16(const char * __restrict__ src, half * __restrict__ dst, const int nblk,
        const int nbr, const int ne1, const int ne2, const size_t nb1, const size_t nb2, const size_t nb3) {
    constexpr int BS = bits == 4 ? 66 : bits == 3 ? 50 : 34;
    const int w0   = turbo_warp_index()*NB;
    const int lane = threadIdx.x % WARP_SIZE;
    if (w0 >= nblk) {
        return;
    }
    const float book = turbo_centroid(bits, lane & ((1 << bits) - 1));
    turbo_block_pos b = turbo_block_at(w0, nbr, ne1, ne2);
    half norm[NB];
    int lo[NB], hi[NB];
#pragma unroll
    for (int j = 0; j < NB; ++j) {
        if (j > 0 && w0 + j < nblk) {   // past the end: the last block again, unstored
            turbo_block_next(b, nbr, ne1, ne2);
        }
        const uint8_t * blk = (const uint8_t *) (src + b.i1*nb1 + b.i2*nb2 + b.i3*nb3) + b.ib*BS;
        norm[j] = *(const half *) blk;
        if (bits == 4) {   // turbo4: codes 4 lane .. 4 lane + 3 are the nibbles of qs[2 lane], qs[2 lane + 1]
            lo[j] = *(const uint16_t *) (blk + 2 + 2*lane);
            hi[j] = 0;
        } else {
            lo[j] = blk[2 + lane];                                                   // codes 4 lane .. 4 lane + 3, 2 bits each
            hi[j] = bits == 3 ? (blk[2 + 32 + (lane >> 1)] >> (4*(lane & 1))) & 15 : 0;   // their high bits
        }
    }
#pragma unroll
    for (int j = 0; j < NB; ++j) {
        const float nj = __half2float(norm[j]);
        half h[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int c = bits == 4 ? (lo[j] >> (4*i)) & 15 : ((lo[j] >> (2*i)) & 3) | (((hi[j] >> i) & 1) << 2);
            h[i] = __float2half(nj*__shfl_sync(0xffffffff, book, c));
        }
        uint2 out;
        out.x = (uint32_t) __half_as_ushort(h[0]) | ((uint32_t) __half_as_ushort(h[1]) << 16);
        out.y = (uint32_t) __half_as_ushort(h[2]) | ((uint32_t) __half_as_ushort(h[3]) << 16);
        if (w0 + j < nblk) {
            *(uint2 *) (dst + (int64_t) (w0 + j)*QK_TURBO + 4*lane) = out;
        }
    }
}

// cell 0's exact rows (ggml_flash_attn_ext_set_cell0; x: F32 [D, n_head_kv, ne3]) over row 0 of every head and
// stream of the decoded cache (contiguous f16 [D, n_kv, n_head_kv, ne3]), except the rows whose first value is NaN
// (not known exactly: the decoded row stays). Block (head, stream), one value per thread and step
static __global__ void k_turbo_cell0_f16(const char * __restrict__ x, half * __restrict__ dst, const int D, const int64_t n_kv,
        const size_t nb1, const size_t nb2) {
    const int h = blockIdx.x, i3 = blockIdx.y;
    const float * row = (const float *) (x + h*nb1 + i3*nb2);
    if ((__float_as_uint(row[0]) & 0x7fffffffu) > 0x7f800000u) {   // NaN (a bit test: ggml-cuda builds with fast math)
        return;
    }
    half * out = dst + ((int64_t) i3*gridDim.x + h)*n_kv*D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        out[d] = __float2half(row[d]);
    }
}

void ggml_cuda_turbo_cell0_f16(cudaStream_t stream, const ggml_tensor * x, const ggml_tensor * t, half * out) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && x->nb[0] == sizeof(float) && x->ne[0] == t->ne[0] && x->ne[1] == t->ne[2] &&
        x->ne[2] == t->ne[3]);
    k_turbo_cell0_f16<<<dim3((unsigned) t->ne[2], (unsigned) t->ne[3]), QK_TURBO, 0, stream>>>((const char *) x->data, out,
        (int) t->ne[0], t->ne[1], x->nb[1], x->nb[2]);
}

// t as a contiguous tensor of `type` at data (no view)
ggml_tensor ggml_cuda_turbo_contiguous_like(const ggml_tensor * t, const ggml_type type, void * data) {
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
    const int64_t nbr  = t->ne[0] / QK_TURBO;
    const int64_t nblk = nbr*t->ne[1]*t->ne[2]*t->ne[3];
    GGML_ASSERT(nblk < INT32_MAX - 8*TURBO_ROT_NB && t->nb[0] == ggml_type_size(t->type));   // the kernel's 32-bit indexes
    constexpr int NB = TURBO_ROT_NB;
    auto kernel = t->type == GGML_TYPE_TURBO4 ? k_turbo_decode_rotated_f16<4, NB> :
                  t->type == GGML_TYPE_TURBO3 ? k_turbo_decode_rotated_f16<3, NB> : k_turbo_decode_rotated_f16<2, NB>;
    kernel<<<turbo_rot_grid(nblk, NB), TURBO_ROT_WARPS*WARP_SIZE, 0, stream>>>((const char *) t->data, out, (int) nblk,
        (int) nbr, (int) t->ne[1], (int) t->ne[2], t->nb[1], t->nb[2], t->nb[3]);
}

bool ggml_cuda_turbo_fattn_prefill(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * Q = dst->src[0];
    const ggml_tensor * K = dst->src[1];
    const ggml_tensor * V = dst->src[2];
    if (ggml_cuda_is_turbo64_type(K->type) || ggml_cuda_is_turbo64_type(V->type)) {
        // the 64-value types take this path (turbo-64.cu) at every batch size but the decode that the tensor-core
        // kernel takes (ggml_cuda_turbo64_fattn_fused: then the decode hook, ggml_cuda_flash_attn_ext_turbo)
        if (ggml_cuda_turbo64_fattn_fused(dst) || !ggml_cuda_turbo64_fattn_supported(dst)) {
            return false;
        }
        ggml_cuda_turbo64_fattn(ctx, dst);
        return true;
    }
    const bool K_turbo = ggml_cuda_is_turbo128_type(K->type), V_turbo = ggml_cuda_is_turbo128_type(V->type);
    if ((!K_turbo && !V_turbo) || Q->ne[1] <= GGML_CUDA_TURBO_FA_MAX_BATCH) {
        return false;
    }
    if (!ggml_cuda_turbo_fattn_pair_supported(dst) || !ggml_is_contiguous(dst) || Q->type != GGML_TYPE_F32) {
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
        const int64_t nblk = ggml_nelements(Q)/QK_TURBO;
        k_turbo_rotate_rows<TURBO_ROT_NB><<<turbo_rot_grid(nblk, TURBO_ROT_NB), dim3(WARP_SIZE, TURBO_ROT_WARPS), 0, stream>>>(
            (const char *) Q->data, q_rot.ptr, D, Q->ne[1], Q->ne[2], Q->nb[1], Q->nb[2], Q->nb[3], nblk);
        Qr = ggml_cuda_turbo_contiguous_like(Q, GGML_TYPE_F32, q_rot.ptr);
        k_rot.alloc(ggml_nelements(K));
        turbo_decode_rotated(stream, K, k_rot.ptr);
        if (dst->src[5]) {
            ggml_cuda_turbo_cell0_f16(stream, dst->src[5], K, k_rot.ptr);
        }
        Kr = ggml_cuda_turbo_contiguous_like(K, GGML_TYPE_F16, k_rot.ptr);
    }
    if (V_turbo) {
        v_rot.alloc(ggml_nelements(V));
        turbo_decode_rotated(stream, V, v_rot.ptr);
        if (dst->src[6]) {
            ggml_cuda_turbo_cell0_f16(stream, dst->src[6], V, v_rot.ptr);
        }
        Vr = ggml_cuda_turbo_contiguous_like(V, GGML_TYPE_F16, v_rot.ptr);
    }
    CUDA_CHECK(cudaGetLastError());

    ggml_tensor dst_r = *dst;   // writes dst's data; K and V are no longer turbo: upstream's dispatch
    dst_r.src[0] = &Qr;
    dst_r.src[1] = &Kr;
    dst_r.src[2] = &Vr;
    ggml_cuda_flash_attn_ext(ctx, &dst_r);

    if (V_turbo) {
        const int64_t nblk = ggml_nelements(dst)/QK_TURBO;
        k_turbo_unrotate_rows<TURBO_ROT_NB><<<turbo_rot_grid(nblk, TURBO_ROT_NB), dim3(WARP_SIZE, TURBO_ROT_WARPS), 0, stream>>>(
            (float *) dst->data, nblk);
        CUDA_CHECK(cudaGetLastError());
    }
    return true;
}
