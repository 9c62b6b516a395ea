// turbo-llama: flash-attention prefill (batches above the fused decode kernel's) with turbo K and/or V,
// through upstream's f16 kernels in the rotated domain (DESIGN.md §2).
//
// Why: the generic path decodes the whole turbo cache to f16 for every ubatch, and each decoded 128-block
// needs an inverse FWHT. Attention does not need the original domain: with R the encoder's orthonormal
// rotation, q.k = (R q).(R k) and sum p v = R^-1 sum p (R v). So here K and V are decoded to f16 in the
// rotated domain (norm x centroid, no transform), q is rotated once (a few rows), upstream's kernel runs on
// f16 K/V, and the output rows are rotated back once.
// This is the prefill path (the generic conversion serves what this does not): decoding without the inverse FWHT
// moves half the work of the generic conversion off the ubatch's critical path, and the decode takes several blocks
// per warp so that a warp has many loads in flight (results/gpu.md has the measurements).
// The kernels are templates over the block size: the 64-value types (64-point rotation, 64-value blocks) are their
// qk = 64 instances. Those types take this path at every batch size but the decode that the tensor-core kernel takes
// (ggml_cuda_turbo64_fattn_fused), with a q8_0 partner converted to f16 here too (upstream's kernel then needs no f16
// space of its own for it).
#include "turbo-common.cuh"
#include "turbo.cuh"
#include "fattn.cuh"


// blocks of 8 warps (threadIdx.y); each warp takes TURBO_ROT_NB consecutive blocks of the rows and issues
// all their loads before it computes: with one block per warp every warp waits one load's latency and the kernel
// runs in many short waves, far from the memory bandwidth
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

// q rows (strided f32) -> contiguous rows of R q, blocks of qk values: signs, FWHT, 1/sqrt(qk)
template <int qk, int NB>
static __global__ void k_turbo_rotate_rows(const char * __restrict__ src, float * __restrict__ dst, const int64_t ne0,
        const int64_t ne1, const int64_t ne2, const size_t nb1, const size_t nb2, const size_t nb3, const int64_t nblk) {
    constexpr int nv = qk/WARP_SIZE;
    const int lane = threadIdx.x;
    const int64_t w0 = ((int64_t) blockIdx.x*TURBO_ROT_WARPS + threadIdx.y)*NB;
    if (w0 >= nblk) {
        return;
    }
    float v[NB][nv];
#pragma unroll
    for (int j = 0; j < NB; ++j) {
        const int64_t wid = w0 + j < nblk ? w0 + j : nblk - 1;   // the tail repeats the last block, unstored
        const int64_t row = wid / (ne0/qk);
        const int b = (int) (wid % (ne0/qk));
        const int64_t i1 = row % ne1, i2 = (row / ne1) % ne2, i3 = row / (ne1*ne2);
        const float * s = (const float *) (src + i1*nb1 + i2*nb2 + i3*nb3) + b*qk;
#pragma unroll
        for (int k = 0; k < nv; ++k) {
            v[j][k] = s[lane + 32*k];
        }
    }
#pragma unroll
    for (int j = 0; j < NB; ++j) {
        if constexpr (qk == QK_TURBO_64) {
            turbo64_warp_rotate(v[j], lane);   // with its 1/8 (exact)
        } else {
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                v[j][k] = turbo_sign_neg(lane + 32*k) ? -v[j][k] : v[j][k];
            }
            turbo_warp_fwht(v[j], lane);
        }
        if (w0 + j < nblk) {
            float * d = dst + (w0 + j)*qk;   // rows of ne0 follow each other: block wid sits at wid*qk
#pragma unroll
            for (int k = 0; k < nv; ++k) {
                d[lane + 32*k] = qk == QK_TURBO_64 ? v[j][k] : v[j][k]*TURBO_CUDA_INV_SQRT_QK;
            }
        }
    }
}

// contiguous f32 rows in place: R^-1 = FWHT, 1/sqrt(qk), signs
template <int qk, int NB>
static __global__ void k_turbo_unrotate_rows(float * __restrict__ x, const int64_t nblk) {
    constexpr int nv = qk/WARP_SIZE;
    const int lane = threadIdx.x;
    const int64_t w0 = ((int64_t) blockIdx.x*TURBO_ROT_WARPS + threadIdx.y)*NB;
    if (w0 >= nblk) {
        return;
    }
    float v[NB][nv];
#pragma unroll
    for (int j = 0; j < NB; ++j) {
        const int64_t wid = w0 + j < nblk ? w0 + j : nblk - 1;   // contiguous rows: the blocks follow each other
#pragma unroll
        for (int k = 0; k < nv; ++k) {
            v[j][k] = x[wid*qk + lane + 32*k];
        }
    }
#pragma unroll
    for (int j = 0; j < NB; ++j) {
        if constexpr (qk == QK_TURBO_64) {
            turbo64_warp_unrotate(v[j], lane);   // with its 1/8 and the signs
        } else {
            turbo_warp_fwht(v[j], lane);
        }
        if (w0 + j < nblk) {
            float * r = x + (w0 + j)*qk;
#pragma unroll
            for (int k = 0; k < nv; ++k) {
                const int i = lane + 32*k;
                if constexpr (qk == QK_TURBO_64) {
                    r[i] = v[j][k];
                } else {
                    const float y = v[j][k]*TURBO_CUDA_INV_SQRT_QK;
                    r[i] = turbo_sign_neg(i) ? -y : y;
                }
            }
        }
    }
}

// the turbo type of a block of qk values with codes of `bits`
template <int bits, int qk>
static constexpr __host__ __device__ ggml_type turbo_type_of() {
    return qk == QK_TURBO_64 ? (bits == 4 ? GGML_TYPE_TURBO4_64 : bits == 3 ? GGML_TYPE_TURBO3_64 : GGML_TYPE_TURBO2_64) :
                               (bits == 4 ? GGML_TYPE_TURBO4    : bits == 3 ? GGML_TYPE_TURBO3    : GGML_TYPE_TURBO2);
}

// turbo blocks (strided rows) -> contiguous f16 rows in the rotated domain: norm x centroid, no transform.
// Per block, each lane nv = qk/32 consecutive values: their codes' bits of the low plane (a byte for 128 values, a
// nibble for 64), those of the high one, the centroids by shuffle from lanes 0..7, one 8-byte (4-byte) store (the
// warp writes the block's f16 values at once); NB blocks per warp.
// (A 128-thread block per row, one value per thread, is slower than even the generic conversion with its FWHT.)
// rows: the rows of each head of dst (ne1, or more with the ring's after them: fattn_ring)
template <int bits, int qk, int NB>
static __global__ void k_turbo_decode_rotated_f16(const char * __restrict__ src, half * __restrict__ dst, const int nblk,
        const int nbr, const int ne1, const int ne2, const size_t nb1, const size_t nb2, const size_t nb3, const int rows) {
    constexpr int BS = turbo_traits<turbo_type_of<bits, qk>()>::bs;
    constexpr int nv = qk/WARP_SIZE;
    const int w0   = turbo_warp_index()*NB;
    const int lane = threadIdx.x % WARP_SIZE;
    if (w0 >= nblk) {
        return;
    }
    const float book = turbo_centroid_qk<qk>(bits, lane & ((1 << bits) - 1));
    turbo_block_pos b = turbo_block_at(w0, nbr, ne1, ne2);
    half norm[NB];
    int lo[NB], hi[NB];
    int64_t ob[NB];   // the block's place in dst
#pragma unroll
    for (int j = 0; j < NB; ++j) {
        if (j > 0 && w0 + j < nblk) {   // past the end: the last block again, unstored
            turbo_block_next(b, nbr, ne1, ne2);
        }
        ob[j] = (((int64_t) b.i3*ne2 + b.i2)*rows + b.i1)*nbr + b.ib;
        const uint8_t * blk = (const uint8_t *) (src + b.i1*nb1 + b.i2*nb2 + b.i3*nb3) + b.ib*BS;
        norm[j] = *(const half *) blk;
        if constexpr (qk == QK_TURBO_64) {   // codes 2 lane, 2 lane + 1
            if (bits == 4) {   // the nibbles of qs[lane]
                lo[j] = blk[2 + lane];
                hi[j] = 0;
            } else {
                lo[j] = (blk[2 + (lane >> 1)] >> (4*(lane & 1))) & 15;                             // 2 bits each
                hi[j] = bits == 3 ? (blk[2 + 16 + (lane >> 2)] >> (2*(lane & 3))) & 3 : 0;   // their high bits
            }
        } else if (bits == 4) {   // turbo4: codes 4 lane .. 4 lane + 3 are the nibbles of qs[2 lane], qs[2 lane + 1]
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
        half h[nv];
#pragma unroll
        for (int i = 0; i < nv; ++i) {
            const int c = bits == 4 ? (lo[j] >> (4*i)) & 15 : ((lo[j] >> (2*i)) & 3) | (((hi[j] >> i) & 1) << 2);
            h[i] = __float2half(nj*__shfl_sync(0xffffffff, book, c));
        }
        if constexpr (qk == QK_TURBO_64) {
            const uint32_t out = (uint32_t) __half_as_ushort(h[0]) | ((uint32_t) __half_as_ushort(h[1]) << 16);
            if (w0 + j < nblk) {
                *(uint32_t *) (dst + ob[j]*qk + 2*lane) = out;
            }
        } else {
            uint2 out;
            out.x = (uint32_t) __half_as_ushort(h[0]) | ((uint32_t) __half_as_ushort(h[1]) << 16);
            out.y = (uint32_t) __half_as_ushort(h[2]) | ((uint32_t) __half_as_ushort(h[3]) << 16);
            if (w0 + j < nblk) {
                *(uint2 *) (dst + ob[j]*qk + 4*lane) = out;
            }
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

void ggml_cuda_turbo_cell0_f16(cudaStream_t stream, const ggml_tensor * x, const ggml_tensor * t, half * out, const int64_t rows) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && x->nb[0] == sizeof(float) && x->ne[0] == t->ne[0] && x->ne[1] == t->ne[2] &&
        x->ne[2] == t->ne[3]);
    k_turbo_cell0_f16<<<dim3((unsigned) t->ne[2], (unsigned) t->ne[3]), QK_TURBO, 0, stream>>>((const char *) x->data, out,
        (int) t->ne[0], rows > 0 ? rows : t->ne[1], x->nb[1], x->nb[2]);
}

// ---- the recent window (ggml_flash_attn_ext_set_ring): its R_pad rows after the n_kv cells of each head, as more keys
// of upstream's kernel, and a mask of n_kv + R_pad columns (the main mask's, then mr's)

// rows [0, n) of an f16 or q8_0 tensor x (strided [D, n, ne2, ne3]) as f16 rows off .. off + n_out - 1 of each head of a
// contiguous f16 dst of `rows` rows per head; rows n .. n_out - 1 zeros (past the ring's R: masked, and no NaN for the
// products). Block (row, head, stream), a value per thread and step
template <ggml_type type>
static __global__ void k_turbo_rows_f16(const char * __restrict__ x, half * __restrict__ dst, const int D, const int n,
        const int64_t rows, const int64_t off, const size_t nb1, const size_t nb2, const size_t nb3) {
    const int i1 = blockIdx.x, i2 = blockIdx.y, i3 = blockIdx.z;
    half * out = dst + (((int64_t) i3*gridDim.y + i2)*rows + off + i1)*D;
    const char * row = x + (int64_t) i1*nb1 + (int64_t) i2*nb2 + (int64_t) i3*nb3;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        if (i1 >= n) {
            out[d] = __float2half(0.0f);
        } else if constexpr (type == GGML_TYPE_F16) {
            out[d] = ((const half *) row)[d];
        } else {
            const block_q8_0 * b = (const block_q8_0 *) row + d/QK8_0;
            out[d] = __float2half(__half2float(b->d)*(float) b->qs[d % QK8_0]);   // as upstream's q8_0 -> f16
        }
    }
}

static void turbo_rows_f16(cudaStream_t stream, const ggml_tensor * x, const int64_t n_out, half * dst, const int64_t rows,
        const int64_t off) {
    GGML_ASSERT(x->type == GGML_TYPE_F16 || x->type == GGML_TYPE_Q8_0);
    GGML_ASSERT(x->nb[0] == ggml_type_size(x->type) && n_out < INT32_MAX && x->ne[2] < 65536 && x->ne[3] < 65536);
    if (n_out == 0) {
        return;
    }
    const dim3 grid((unsigned) n_out, (unsigned) x->ne[2], (unsigned) x->ne[3]);
    auto kernel = x->type == GGML_TYPE_F16 ? k_turbo_rows_f16<GGML_TYPE_F16> : k_turbo_rows_f16<GGML_TYPE_Q8_0>;
    kernel<<<grid, 128, 0, stream>>>((const char *) x->data, dst, (int) x->ne[0], (int) x->ne[1], rows, off, x->nb[1],
        x->nb[2], x->nb[3]);
}

// the main mask ([n_kv, ne1, ne2, ne3]) and the ring's (mr: [R_pad, ...]) side by side: contiguous F16 [n_kv + R_pad, ne1,
// ne2, ne3]. Block (row, dim 2, dim 3)
static __global__ void k_turbo_mask_ring(const char * __restrict__ mask, const char * __restrict__ mr, half * __restrict__ dst,
        const int n_kv, const int r_pad, const size_t nb1, const size_t nb2, const size_t nb3, const size_t mr_nb1,
        const size_t mr_nb2, const size_t mr_nb3) {
    const int i1 = blockIdx.x, i2 = blockIdx.y, i3 = blockIdx.z;
    const half * a = (const half *) (mask + i1*nb1 + i2*nb2 + i3*nb3);
    const half * b = (const half *) (mr + i1*mr_nb1 + i2*mr_nb2 + i3*mr_nb3);
    half * out = dst + (((int64_t) i3*gridDim.y + i2)*gridDim.x + i1)*(n_kv + r_pad);
    for (int c = threadIdx.x; c < n_kv + r_pad; c += blockDim.x) {
        out[c] = c < n_kv ? a[c] : b[c - n_kv];
    }
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

// the turbo blocks of t decoded to f16 in the rotated domain (contiguous, at out, rows rows per head)
template <int qk>
static void turbo_decode_rotated(cudaStream_t stream, const ggml_tensor * t, half * out, const int64_t rows) {
    GGML_ASSERT(rows >= t->ne[1] && rows < INT32_MAX);
    const int64_t nbr  = t->ne[0] / qk;
    const int64_t nblk = nbr*t->ne[1]*t->ne[2]*t->ne[3];
    GGML_ASSERT(nblk < INT32_MAX - 8*TURBO_ROT_NB && t->nb[0] == ggml_type_size(t->type));   // the kernel's 32-bit indexes
    constexpr int NB = TURBO_ROT_NB;
    const int bits = ggml_cuda_turbo_bits(t->type);
    auto kernel = bits == 4 ? k_turbo_decode_rotated_f16<4, qk, NB> :
                  bits == 3 ? k_turbo_decode_rotated_f16<3, qk, NB> : k_turbo_decode_rotated_f16<2, qk, NB>;
    kernel<<<turbo_rot_grid(nblk, NB), TURBO_ROT_WARPS*WARP_SIZE, 0, stream>>>((const char *) t->data, out, (int) nblk,
        (int) nbr, (int) t->ne[1], (int) t->ne[2], t->nb[1], t->nb[2], t->nb[3], (int) rows);
}

// the K or V side as upstream's kernel gets it: turbo blocks of qk values decoded rotated (cell 0's exact rows, when
// given, over row 0); another type as it is, or with convert_plain a q8_0 (any type with a to_fp16 conversion) converted.
// With the ring's rows (ggml_flash_attn_ext_set_ring; r_pad > 0: q8_0 rows in the rotated domain for a turbo side, else
// the side's type) every side is converted, and the ring's first r_pad rows follow each head's n_kv (zeros past R)
template <int qk>
static ggml_tensor turbo_side_f16(cudaStream_t stream, const ggml_tensor * t, const ggml_tensor * cell0,
        const bool convert_plain, ggml_cuda_pool_alloc<half> & buf, const ggml_tensor * ring = nullptr, const int64_t r_pad = 0) {
    const int64_t rows = t->ne[1] + (ring ? r_pad : 0);
    if (ring) {
        buf.alloc(t->ne[0]*rows*t->ne[2]*t->ne[3]);
    }
    if (ggml_cuda_turbo_qk(t->type) == qk) {
        if (!ring) {
            buf.alloc(ggml_nelements(t));
        }
        turbo_decode_rotated<qk>(stream, t, buf.ptr, rows);
        if (cell0) {
            ggml_cuda_turbo_cell0_f16(stream, cell0, t, buf.ptr, rows);
        }
    } else if (ring) {
        turbo_rows_f16(stream, t, t->ne[1], buf.ptr, rows, 0);
    } else if (t->type == GGML_TYPE_F16 || !convert_plain) {
        return *t;
    } else {
        buf.alloc(ggml_nelements(t));
        const size_t ts = ggml_type_size(t->type);
        GGML_ASSERT(t->nb[0] == ts);
        const to_fp16_nc_cuda_t conv = ggml_get_to_fp16_nc_cuda(t->type);
        GGML_ASSERT(conv);
        conv(t->data, buf.ptr, t->ne[0], t->ne[1], t->ne[2], t->ne[3], t->nb[1]/ts, t->nb[2]/ts, t->nb[3]/ts, stream);
    }
    if (ring) {
        turbo_rows_f16(stream, ring, r_pad, buf.ptr, rows, t->ne[1]);
    }
    ggml_tensor r = ggml_cuda_turbo_contiguous_like(t, GGML_TYPE_F16, buf.ptr);
    r.ne[1] = rows;
    for (int i = 2; i < GGML_MAX_DIMS; ++i) {
        r.nb[i] = r.nb[i - 1]*r.ne[i - 1];
    }
    return r;
}

// the attention in the rotated domain (see the top): q rotated when K is turbo, the sides through turbo_side_f16,
// upstream's kernels on f16 K/V, the output rotated back when V is turbo
template <int qk>
static void turbo_fattn_rotated(ggml_backend_cuda_context & ctx, ggml_tensor * dst, const bool convert_plain) {
    const ggml_tensor * Q = dst->src[0];
    const ggml_tensor * K = dst->src[1];
    const ggml_tensor * V = dst->src[2];
    const bool K_turbo = ggml_cuda_turbo_qk(K->type) == qk, V_turbo = ggml_cuda_turbo_qk(V->type) == qk;
    ggml_cuda_turbo_check_tables();
    cudaStream_t stream = ctx.stream();
    ggml_cuda_pool & pool = ctx.pool();

    ggml_cuda_pool_alloc<float> q_rot(pool);
    ggml_cuda_pool_alloc<half>  k_rot(pool), v_rot(pool);
    ggml_tensor Qr = *Q;
    if (K_turbo) {
        q_rot.alloc(ggml_nelements(Q));
        const int64_t nblk = ggml_nelements(Q)/qk;
        k_turbo_rotate_rows<qk, TURBO_ROT_NB><<<turbo_rot_grid(nblk, TURBO_ROT_NB), dim3(WARP_SIZE, TURBO_ROT_WARPS), 0, stream>>>(
            (const char *) Q->data, q_rot.ptr, Q->ne[0], Q->ne[1], Q->ne[2], Q->nb[1], Q->nb[2], Q->nb[3], nblk);
        Qr = ggml_cuda_turbo_contiguous_like(Q, GGML_TYPE_F32, q_rot.ptr);
    }
    // the ring (ggml_flash_attn_ext_set_ring): its rows after the cells, mr's R_pad columns after the main mask's
    const bool ring = ggml_cuda_turbo_fattn_has_ring(dst);
    const ggml_tensor * mask = dst->src[3];
    const ggml_tensor * mr   = ring ? dst->src[9] : nullptr;
    const int64_t r_pad = ring ? mr->ne[0] : 0;
    ggml_tensor Kr = turbo_side_f16<qk>(stream, K, dst->src[5], convert_plain, k_rot, ring ? dst->src[7] : nullptr, r_pad);
    ggml_tensor Vr = turbo_side_f16<qk>(stream, V, dst->src[6], convert_plain, v_rot, ring ? dst->src[8] : nullptr, r_pad);
    ggml_cuda_pool_alloc<half> m_ring(pool);
    ggml_tensor Mr;
    if (ring) {
        const int64_t n_kv = K->ne[1];
        GGML_ASSERT(mask && mask->ne[0] >= n_kv && n_kv + r_pad < INT32_MAX);
        Mr = *mask;
        Mr.ne[0] = n_kv + r_pad;
        m_ring.alloc(ggml_nelements(&Mr));
        Mr = ggml_cuda_turbo_contiguous_like(&Mr, GGML_TYPE_F16, m_ring.ptr);
        k_turbo_mask_ring<<<dim3((unsigned) mask->ne[1], (unsigned) mask->ne[2], (unsigned) mask->ne[3]), 256, 0, stream>>>(
            (const char *) mask->data, (const char *) mr->data, m_ring.ptr, (int) n_kv, (int) r_pad, mask->nb[1], mask->nb[2],
            mask->nb[3], mr->nb[1], mr->nb[2], mr->nb[3]);
    }
    CUDA_CHECK(cudaGetLastError());

    ggml_tensor dst_r = *dst;   // writes dst's data; K and V are no longer turbo: upstream's dispatch
    dst_r.src[0] = &Qr;
    dst_r.src[1] = &Kr;
    dst_r.src[2] = &Vr;
    dst_r.src[5] = nullptr;     // cell 0's rows are in Kr / Vr now
    dst_r.src[6] = nullptr;
    if (ring) {
        dst_r.src[3] = &Mr;     // and the ring's rows and mask
        dst_r.src[7] = dst_r.src[8] = dst_r.src[9] = nullptr;
    }
    ggml_cuda_flash_attn_ext(ctx, &dst_r);

    if (V_turbo) {
        const int64_t nblk = ggml_nelements(dst)/qk;
        k_turbo_unrotate_rows<qk, TURBO_ROT_NB><<<turbo_rot_grid(nblk, TURBO_ROT_NB), dim3(WARP_SIZE, TURBO_ROT_WARPS), 0, stream>>>(
            (float *) dst->data, nblk);
        CUDA_CHECK(cudaGetLastError());
    }
}

static bool turbo64_fattn_side_ok(const ggml_tensor * t) {
    return (ggml_cuda_turbo_qk(t->type) == QK_TURBO_64 || t->type == GGML_TYPE_F16 || t->type == GGML_TYPE_Q8_0) &&
        t->nb[0] == ggml_type_size(t->type);
}

bool ggml_cuda_turbo64_fattn_supported(const ggml_tensor * dst) {
    const ggml_tensor * Q = dst->src[0];
    const ggml_tensor * K = dst->src[1];
    const ggml_tensor * V = dst->src[2];
    if (ggml_cuda_turbo_qk(K->type) != QK_TURBO_64 && ggml_cuda_turbo_qk(V->type) != QK_TURBO_64) {
        return false;
    }
    if (!turbo64_fattn_side_ok(K) || !turbo64_fattn_side_ok(V) || Q->type != GGML_TYPE_F32 || dst->type != GGML_TYPE_F32 ||
        !ggml_is_contiguous(dst)) {
        return false;
    }
    if (Q->ne[0] % QK_TURBO_64 != 0 || K->ne[0] != Q->ne[0] || V->ne[0] % QK_TURBO_64 != 0) {
        return false;
    }
    // upstream's f16 kernels must take the op as it will be run: f16 K/V of the same shapes, no cell-0 rows
    ggml_tensor Kf = ggml_cuda_turbo_contiguous_like(K, GGML_TYPE_F16, K->data);
    ggml_tensor Vf = ggml_cuda_turbo_contiguous_like(V, GGML_TYPE_F16, V->data);
    if (!ggml_cuda_turbo_fattn_ring_ok(dst)) {
        return false;
    }
    if (dst->src[7]) {   // the ring's rows after the cells
        Kf.ne[1] += dst->src[9]->ne[0];
        Vf.ne[1] += dst->src[9]->ne[0];
    }
    ggml_tensor d = *dst;
    d.src[1] = &Kf;
    d.src[2] = &Vf;
    d.src[5] = nullptr;
    d.src[6] = nullptr;
    d.src[7] = d.src[8] = d.src[9] = nullptr;
    return ggml_cuda_flash_attn_ext_supported(ggml_cuda_get_device(), &d);
}

void ggml_cuda_turbo64_fattn(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    GGML_ASSERT(ggml_cuda_turbo64_fattn_supported(dst));
    turbo_fattn_rotated<QK_TURBO_64>(ctx, dst, true);
}

bool ggml_cuda_turbo_fattn_prefill(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * Q = dst->src[0];
    const ggml_tensor * K = dst->src[1];
    const ggml_tensor * V = dst->src[2];
    if (ggml_cuda_turbo_qk(K->type) == QK_TURBO_64 || ggml_cuda_turbo_qk(V->type) == QK_TURBO_64) {
        // every batch size but the decode that the tensor-core kernel takes (ggml_cuda_turbo64_fattn_fused: then the
        // decode hook, ggml_cuda_flash_attn_ext_turbo)
        if (ggml_cuda_turbo64_fattn_fused(dst) || !ggml_cuda_turbo64_fattn_supported(dst)) {
            return false;
        }
        turbo_fattn_rotated<QK_TURBO_64>(ctx, dst, true);
        return true;
    }
    const bool K_turbo = ggml_cuda_turbo_qk(K->type) == QK_TURBO, V_turbo = ggml_cuda_turbo_qk(V->type) == QK_TURBO;
    if ((!K_turbo && !V_turbo) || Q->ne[1] <= GGML_CUDA_TURBO_FA_MAX_BATCH) {
        return false;
    }
    if (!ggml_cuda_turbo_fattn_pair_supported(dst) || !ggml_is_contiguous(dst) || Q->type != GGML_TYPE_F32) {
        return false;
    }
    turbo_fattn_rotated<QK_TURBO>(ctx, dst, false);   // a q8_0 partner: upstream's own conversion
    return true;
}
