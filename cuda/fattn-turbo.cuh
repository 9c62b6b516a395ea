// turbo-llama: flash-attention decode with turbo K and/or V, in the rotated domain (DESIGN.md §2, §6).
//
// One CUDA block = one KV head x up to NCOLS query rows (all heads of the GQA group, times the batch's
// tokens) x one split of the KV sequence, walked in tiles of 128 keys with an online softmax.
//   - q is rotated once per block (H D q / sqrt(128), times the softmax scale) when K is turbo;
//   - K·q: 3/2-bit code -> centroid from a shared 8-entry table, one norm multiply per 128-block;
//   - V: sum_j p_j norm_j c_j accumulated in the rotated domain; the combine kernel merges the
//     splits and applies D H / sqrt(128) once per output row.
// Turbo K/V tiles are staged through shared memory by coalesced 16-bit loads (the blocks are 50/34
// bytes, 2-byte aligned); f16 and q8_0 K/V rows are read from global memory directly.
#pragma once

#include "turbo-common.cuh"
#include "turbo.cuh"

#define TURBO_FA_THREADS 128
#define TURBO_FA_TILE    32   // keys per tile: 4 threads per key in the scores phase, one lane per key in the softmax
#define TURBO_FA_RING_KEYS 64 // ring keys per extra block (turbo_fa_extra_block)

// The extra blocks: cell 0 (the first key, which takes much of the attention) with its exact rows
// (ggml_flash_attn_ext_set_cell0) and the recent window's ring rows (ggml_flash_attn_ext_set_ring). With cell 0 on,
// the split blocks walk keys 1.. (turbo_fa_params' K, V and mask start one key in, n_kv is one less: their loops are
// the same as without), and key 0's partial result goes into the first extra slot; the ring's R keys go in chunks of
// r_keys to the extra slots after the splits', which the combine merges like any other split (turbo_fa_extra_block),
// written by n_extra more blocks per row group (the last blockIdx.x)
struct turbo_fa_cell0 {
    int on;                                              // n_extra blocks per row group (0: none)
    int n_extra;
    int c0;                                              // cell 0's key is the first extra block's
    const char * K; const char * V; const char * mask;   // the op's own K, V and mask: key 0 is row (column) 0
    const float * k0; const float * v0;                  // the exact rows (turbo K, turbo V only), or nullptr
    int64_t k0_nb1, k0_nb2, v0_nb1, v0_nb2;
    // the ring: kr, vr rows r of each KV head and stream (q8_0 in the rotated domain for a turbo side, else the side's
    // type), mr their mask (F16, column r); extra block e takes rows [e*r_keys, min(R, (e + 1)*r_keys))
    const char * kr; const char * vr; const char * mr;
    int r_n, r_keys;
    int64_t kr_nb1, kr_nb2, kr_nb3, vr_nb1, vr_nb2, vr_nb3, mr_nb1, mr_nb3;
};

struct turbo_fa_params {
    const char * Q; const char * K; const char * V; const char * mask;
    float * part_acc; float2 * part_meta;
    float scale; float logit_softcap; float max_bias; float m0; float m1; uint32_t n_head_log2;
    int n_q; int n_head; int gqa; int n_kv; int ne13; int ne23; int ne33;
    int64_t nb01, nb02, nb03, nb11, nb12, nb13, nb21, nb22, nb23, nb31, nb33;
    int nrg; int n_split; int tiles_per_split;
    // tensor-core kernel only: Q's RoPE, applied to q as it is loaded (rope.pos == nullptr: Q is used as it is);
    // then Q points to the ROPE's input (patch 0021). rope_once (one token, D = 128): the lane's cos and sin computed
    // once for all rows (the same position) and the pad rows (zeros) left out
    turbo_rope rope;
    int rope_once;
    turbo_fa_cell0 c0;
};

static __device__ __forceinline__ bool turbo_fa_isnan(const float x) {
    return (__float_as_uint(x) & 0x7fffffffu) > 0x7f800000u;   // (a bit test: ggml-cuda builds with fast math)
}

// value d of a K or V row as the kernels' products see it: a turbo row decoded in the rotated domain (norm times
// centroid, as the split blocks take it), f16 and q8_0 rows as they are
template <ggml_type type>
static __device__ __forceinline__ float turbo_fa_row_value(const char * row, const int d) {
    if constexpr (ggml_cuda_is_turbo_type(type)) {
        constexpr int bits = turbo_traits<type>::bits, qk = turbo_traits<type>::qk;
        const uint8_t * blk = (const uint8_t *) row + (d / qk)*sizeof(typename turbo_traits<type>::block_t);
        const uint8_t * qs = blk + 2;
        const int i = d % qk;
        int c = bits == 4 ? (qs[i >> 1] >> (4*(i & 1))) & 15 : (qs[i >> 2] >> (2*(i & 3))) & 3;
        if (bits == 3) {
            c |= ((qs[qk/4 + (i >> 3)] >> (i & 7)) & 1) << 2;   // the high plane after the qk/4 bytes of the low one
        }
        return turbo_centroid_qk<qk>(bits, c)*__half2float(*(const half *) blk);
    } else if constexpr (type == GGML_TYPE_F16) {
        return __half2float(((const half *) row)[d]);
    } else {
        const block_q8_0 * b = (const block_q8_0 *) row + d / QK8_0;
        return __half2float(b->d)*(float) b->qs[d % QK8_0];
    }
}

// The extra blocks (turbo_fa_cell0): block e (of n_extra) of the group (KV head hk, row group rg, dim 3 iq3) takes
// key 0 when e == 0 and cell 0 is on (K's exact row when it has one, its first value not NaN, else K's row 0 as the split
// blocks decode it; V likewise) and ring rows [e*r_keys, ..): for every real row of the group the scores, softcapped,
// masked and ALiBi'd as the split blocks do it, an online softmax, the partial result (max in base e, sum, values in
// V's domain: rotated for a turbo V) into slot blockIdx.x of the group. qf(r, d): row r's q at dim d as the products
// take it (rotated for a turbo K, times the softmax scale, base e). Warp w takes rows w, w + NT/32, ... (no block
// barrier; each row's result is one warp's), lane l dims l + 32i, XB keys at a time, their loads issued together and a
// batch ahead (the block is latency-bound: a key at a time, 64 keys would take longer than a short decode's splits).
// The tensor-core kernel calls it not inlined (turbo_fa_extra_block_call): inlined there, its loops' registers changed
// (the one-tile loop spilled 4 bytes, the two-tile loop 8), while the cell-0 block alone had left them as they were.
template <int D, ggml_type type_K, ggml_type type_V, int NR, int NT, int XB, typename QF>
static __device__ __forceinline__ void turbo_fa_extra_block(const turbo_fa_params & p, const int hk, const int rg, const int iq3,
        const QF & qf) {
    constexpr int NWX = NT/WARP_SIZE;
    constexpr int RPW = (NR + NWX - 1)/NWX;   // rows per warp
    constexpr int NV  = D/WARP_SIZE;          // dims per lane
    // the ring's rows: q8_0 (rotated) for a turbo side, the side's own type otherwise
    constexpr ggml_type type_KR = ggml_cuda_is_turbo_type(type_K) ? GGML_TYPE_Q8_0 : type_K;
    constexpr ggml_type type_VR = ggml_cuda_is_turbo_type(type_V) ? GGML_TYPE_Q8_0 : type_V;
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const turbo_fa_cell0 & c0 = p.c0;
    const int e = (int) blockIdx.x - ((int) gridDim.x - c0.n_extra);
    const int R = p.gqa*p.n_q;

    float M[RPW], L[RPW], acc[RPW][NV], slope[RPW];
    int jq[RPW];
    bool ok[RPW];
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
        const int r = warp + i*NWX;
        const int rho = rg*NR + r;
        ok[i] = r < NR && rho < R;   // warp-uniform
        jq[i] = ok[i] ? rho / p.gqa : 0;
        slope[i] = get_alibi_slope(p.max_bias, hk*p.gqa + (ok[i] ? rho % p.gqa : 0), p.n_head_log2, p.m0, p.m1);
        M[i] = -INFINITY;
        L[i] = 0.0f;
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            acc[i][k] = 0.0f;
        }
    }
    // row i's score of a K row (values kv, NV per lane) with mask value m: the product, softcap, the mask times the
    // slope, as the split blocks apply them (q read where it is used)
    auto score = [&](const int i, const float kv[NV], const float m) {
        float x = 0.0f;
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            x += qf(warp + i*NWX, lane + 32*k)*kv[k];
        }
        x = warp_reduce_sum(x);
        if (p.logit_softcap != 0.0f) {
            x = p.logit_softcap*tanhf(x/p.logit_softcap);
        }
        return x + slope[i]*m;
    };
    // XB keys' scores s[b][i] (-inf: no key) and values vv merged into each row's online softmax
    auto merge = [&](const float s[XB][RPW], const float vv[XB][NV]) {
#pragma unroll
        for (int i = 0; i < RPW; ++i) {
            float mx = M[i];
#pragma unroll
            for (int b = 0; b < XB; ++b) {
                mx = fmaxf(mx, s[b][i]);
            }
            if (mx == -INFINITY) {
                continue;   // nothing seen yet (warp-uniform)
            }
            const float alpha = expf(M[i] - mx);   // 0 while M is -inf
            L[i] *= alpha;
#pragma unroll
            for (int k = 0; k < NV; ++k) {
                acc[i][k] *= alpha;
            }
#pragma unroll
            for (int b = 0; b < XB; ++b) {
                const float pb = s[b][i] == -INFINITY ? 0.0f : expf(s[b][i] - mx);
                L[i] += pb;
#pragma unroll
                for (int k = 0; k < NV; ++k) {
                    acc[i][k] += pb*vv[b][k];
                }
            }
            M[i] = mx;
        }
    };

    if (c0.c0 && e == 0) {
        // key 0 (the batch's other keys absent)
        const char * krow = c0.K + (int64_t) hk*p.nb12 + (int64_t) (iq3 % p.ne13)*p.nb13;
        const char * vrow = c0.V + (int64_t) hk*p.nb22 + (int64_t) (iq3 % p.ne23)*p.nb23;
        const float * kx = c0.k0 ? (const float *) ((const char *) c0.k0 + hk*c0.k0_nb1 + (iq3 % p.ne13)*c0.k0_nb2) : nullptr;
        const float * vx = c0.v0 ? (const float *) ((const char *) c0.v0 + hk*c0.v0_nb1 + (iq3 % p.ne23)*c0.v0_nb2) : nullptr;
        if (kx && turbo_fa_isnan(kx[0])) {
            kx = nullptr;   // not known exactly: decoded as usual
        }
        if (vx && turbo_fa_isnan(vx[0])) {
            vx = nullptr;
        }
        float kv[NV], vv[XB][NV], s[XB][RPW];
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int d = lane + 32*k;
            kv[k] = kx ? kx[d] : turbo_fa_row_value<type_K>(krow, d);
#pragma unroll
            for (int b = 0; b < XB; ++b) {
                vv[b][k] = b > 0 ? 0.0f : vx ? vx[d] : turbo_fa_row_value<type_V>(vrow, d);
            }
        }
#pragma unroll
        for (int i = 0; i < RPW; ++i) {
            const float m = c0.mask ?
                __half2float(*(const half *) (c0.mask + (int64_t) (iq3 % p.ne33)*p.nb33 + (int64_t) jq[i]*p.nb31)) : 0.0f;
            const float x = score(i, kv, m);
            s[0][i] = ok[i] ? x : -INFINITY;
#pragma unroll
            for (int b = 1; b < XB; ++b) {
                s[b][i] = -INFINITY;
            }
        }
        merge(s, vv);
    }

    if (c0.r_n > 0) {
        const int r0 = e*c0.r_keys, r1 = min(c0.r_n, r0 + c0.r_keys);
        const char * krb = c0.kr + (int64_t) hk*c0.kr_nb2 + (int64_t) (iq3 % p.ne13)*c0.kr_nb3;
        const char * vrb = c0.vr + (int64_t) hk*c0.vr_nb2 + (int64_t) (iq3 % p.ne23)*c0.vr_nb3;
        const char * mrb = c0.mr + (int64_t) (iq3 % p.ne33)*c0.mr_nb3;
        // the rows and mask values of keys k0 .. k0 + XB - 1 (past the end: the last key again, not counted)
        auto load = [&](const int k0, float kv[XB][NV], float vv[XB][NV], float m[XB][RPW]) {
#pragma unroll
            for (int b = 0; b < XB; ++b) {
                const int key = min(k0 + b, r1 - 1);
#pragma unroll
                for (int k = 0; k < NV; ++k) {
                    kv[b][k] = turbo_fa_row_value<type_KR>(krb + (int64_t) key*c0.kr_nb1, lane + 32*k);
                    vv[b][k] = turbo_fa_row_value<type_VR>(vrb + (int64_t) key*c0.vr_nb1, lane + 32*k);
                }
#pragma unroll
                for (int i = 0; i < RPW; ++i) {
                    m[b][i] = __half2float(((const half *) (mrb + (int64_t) jq[i]*c0.mr_nb1))[key]);
                }
            }
        };
        auto take = [&](const int k0, const float kv[XB][NV], const float vv[XB][NV], const float m[XB][RPW]) {
            float s[XB][RPW];
#pragma unroll
            for (int b = 0; b < XB; ++b) {
#pragma unroll
                for (int i = 0; i < RPW; ++i) {
                    const float x = score(i, kv[b], m[b][i]);
                    s[b][i] = k0 + b < r1 && ok[i] ? x : -INFINITY;
                }
            }
            merge(s, vv);
        };
        // two batches in flight: the next one's loads go out before this one's products (latency-bound otherwise)
        float kvA[XB][NV], vvA[XB][NV], mA[XB][RPW], kvB[XB][NV], vvB[XB][NV], mB[XB][RPW];
        if (r0 < r1) {
            load(r0, kvA, vvA, mA);
        }
        for (int k0 = r0; k0 < r1; k0 += 2*XB) {
            if (k0 + XB < r1) {
                load(k0 + XB, kvB, vvB, mB);
            }
            take(k0, kvA, vvA, mA);
            if (k0 + XB >= r1) {
                break;
            }
            if (k0 + 2*XB < r1) {
                load(k0 + 2*XB, kvA, vvA, mA);
            }
            take(k0 + XB, kvB, vvB, mB);
        }
    }

    const int64_t slot = ((int64_t) (iq3*gridDim.y + blockIdx.y))*p.n_split + blockIdx.x;
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
        if (!ok[i]) {
            continue;   // a pad row, never read
        }
        float * a = p.part_acc + (slot*NR + warp + i*NWX)*D;
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            a[lane + 32*k] = acc[i][k];
        }
        if (lane == 0) {
            p.part_meta[slot*NR + warp + i*NWX] = make_float2(M[i], M[i] == -INFINITY ? 0.0f : L[i]);
        }
    }
}

// ... as a call: p by value (copied to the call's stack by the extra blocks alone; taken by reference, a kernel parameter
// has no generic address without __grid_constant__), so that ptxas allocates the kernel's loops as without the block;
// 2 keys at a time, 1 at D = 256, two batches in flight (more spilled under the one-tile loops' 128 registers)
template <int D, ggml_type type_K, ggml_type type_V, int NR, int NT, typename QF>
static __device__ __noinline__ void turbo_fa_extra_block_call(const turbo_fa_params p, const int hk, const int rg,
        const int iq3, const QF qf) {
    turbo_fa_extra_block<D, type_K, type_V, NR, NT, D == 64 ? 2 : 256/D>(p, hk, rg, iq3, qf);
}

// stage NB 128-blocks of TILE keys of a turbo K or V into shared memory: words (qs) and norms
template <ggml_type type, int NB>
static __device__ __forceinline__ void turbo_fa_stage_tile(const char * base, const int64_t nb1, const int k0, const int n_kv,
        uint32_t * words, float * norms) {
    constexpr int QSW = turbo_traits<type>::qsw;
    constexpr int BS  = turbo_traits<type>::bs;
    constexpr int STRIDE = QSW*NB + 1;
    const int tid = threadIdx.x;
    for (int it = tid; it < TURBO_FA_TILE*NB*QSW; it += TURBO_FA_THREADS) {
        const int w  = it % QSW;
        const int kb = it / QSW;
        const int b  = kb % NB;
        const int kk = kb / NB;
        uint32_t val = 0;
        if (k0 + kk < n_kv) {
            const uint16_t * p = (const uint16_t *) (base + (int64_t) (k0 + kk)*nb1 + b*BS + 2 + 4*w);
            val = (uint32_t) p[0] | ((uint32_t) p[1] << 16);
        }
        words[kk*STRIDE + b*QSW + w] = val;
    }
    for (int it = tid; it < TURBO_FA_TILE*NB; it += TURBO_FA_THREADS) {
        const int b  = it % NB;
        const int kk = it / NB;
        float n = 0.0f;
        if (k0 + kk < n_kv) {
            n = __half2float(*(const half *) (base + (int64_t) (k0 + kk)*nb1 + b*BS));
        }
        norms[kk*NB + b] = n;
    }
}

// the same staging split in two: global loads into registers (issued one tile ahead, so that their
// latency overlaps the compute of the current tile), then the stores into shared memory
template <ggml_type type, int NB>
struct turbo_fa_pref {
    static constexpr int QSW = turbo_traits<type>::qsw;
    static constexpr int NW  = (TURBO_FA_TILE*NB*QSW + TURBO_FA_THREADS - 1) / TURBO_FA_THREADS;
    uint32_t w[NW];
    half     n;

    __device__ __forceinline__ void load(const char * base, const int64_t nb1, const int k0, const int n_kv) {
        constexpr int BS = turbo_traits<type>::bs;
        const int tid = threadIdx.x;
#pragma unroll
        for (int i = 0; i < NW; ++i) {
            const int it = tid + i*TURBO_FA_THREADS;
            const int ww = it % QSW;
            const int kb = it / QSW;
            const int b  = kb % NB;
            const int kk = kb / NB;
            uint32_t val = 0;
            if (it < TURBO_FA_TILE*NB*QSW && k0 + kk < n_kv) {
                const uint16_t * p = (const uint16_t *) (base + (int64_t) (k0 + kk)*nb1 + b*BS + 2 + 4*ww);
                val = (uint32_t) p[0] | ((uint32_t) p[1] << 16);
            }
            w[i] = val;
        }
        n = __float2half(0.0f);
        if (tid < TURBO_FA_TILE*NB) {
            const int b = tid % NB, kk = tid / NB;
            if (k0 + kk < n_kv) {
                n = *(const half *) (base + (int64_t) (k0 + kk)*nb1 + b*BS);
            }
        }
    }
    __device__ __forceinline__ void store(uint32_t * words, float * norms) const {
        constexpr int STRIDE = QSW*NB + 1;
        const int tid = threadIdx.x;
#pragma unroll
        for (int i = 0; i < NW; ++i) {
            const int it = tid + i*TURBO_FA_THREADS;
            if (it < TURBO_FA_TILE*NB*QSW) {
                const int ww = it % QSW;
                const int kb = it / QSW;
                const int b  = kb % NB;
                const int kk = kb / NB;
                words[kk*STRIDE + b*QSW + ww] = w[i];
            }
        }
        if (tid < TURBO_FA_TILE*NB) {
            norms[tid] = __half2float(n);   // index kk*NB + b == tid
        }
    }
};
template <int NB> struct turbo_fa_pref<GGML_TYPE_F16, NB> {
    __device__ __forceinline__ void load(const char *, int64_t, int, int) {}
    __device__ __forceinline__ void store(uint32_t *, float *) const {}
};
template <int NB> struct turbo_fa_pref<GGML_TYPE_Q8_0, NB> {
    __device__ __forceinline__ void load(const char *, int64_t, int, int) {}
    __device__ __forceinline__ void store(uint32_t *, float *) const {}
};

template <int bits>
static __device__ __forceinline__ int turbo_fa_code(const uint32_t * w, const int i) {
    if (bits == 4) {
        return (w[i >> 3] >> (4*(i & 7))) & 15;   // turbo4: code i is nibble i & 1 of byte i/2
    }
    int c = (w[i >> 4] >> ((i & 15)*2)) & 3;
    if (bits == 3) {
        c |= ((w[8 + (i >> 5)] >> (i & 31)) & 1) << 2;
    }
    return c;
}

// q layout in shared memory: every 32-value quarter of a 128-block is padded by 4 floats, so that the
// 4 threads of one key (one quarter each) read 4 different bank groups
template <int D> static __device__ __forceinline__ int turbo_fa_qidx(const int r, const int e) {
    return r*(D + D/8) + e + (e >> 5)*4;
}

template <int D, ggml_type type_K, ggml_type type_V, int NCOLS>
__launch_bounds__(TURBO_FA_THREADS)
static __global__ void k_turbo_fattn(const turbo_fa_params p) {
    constexpr int NB = D / QK_TURBO;
    constexpr bool K_turbo = ggml_cuda_turbo_qk(type_K) == QK_TURBO;
    constexpr bool V_turbo = ggml_cuda_turbo_qk(type_V) == QK_TURBO;
    constexpr int KQSW = turbo_traits<type_K>::qsw, VQSW = turbo_traits<type_V>::qsw;
    constexpr int KSTRIDE = KQSW*NB + 1, VSTRIDE = VQSW*NB + 1;
    constexpr int KWORDS = K_turbo ? TURBO_FA_TILE*KSTRIDE : 1;
    constexpr int VWORDS = V_turbo ? TURBO_FA_TILE*VSTRIDE : 1;
    constexpr int KNORMS = K_turbo ? TURBO_FA_TILE*NB : 1;
    constexpr int VNORMS = V_turbo ? TURBO_FA_TILE*NB : 1;
    constexpr int NPB = V_turbo ? NB : 1;   // p (times the V norm of each 128-block when V is turbo)
    constexpr int QSTRIDE = D + D/8;

    __shared__ float4   q_sh4[NCOLS*QSTRIDE/4];
    __shared__ uint32_t kw_sh[KWORDS];
    __shared__ uint32_t vw_sh[VWORDS];
    __shared__ float    kn_sh[KNORMS];
    __shared__ float    vn_sh[VNORMS];
    __shared__ float4   P_sh4[NPB*TURBO_FA_TILE*NCOLS/4];
    __shared__ float    S_tile[TURBO_FA_TILE*NCOLS];
    __shared__ float    M_sh[NCOLS], S_sh[NCOLS], A_sh[NCOLS], slope_sh[NCOLS];
    __shared__ int      row_j_sh[NCOLS];
    __shared__ float2   pairK[turbo_traits<type_K>::bits == 4 ? 256 : 64];
    __shared__ float    ctabV[turbo_traits<type_V>::bits == 4 ? 16 : 8];

    float * q_sh = (float *) q_sh4;
    float * P_sh = (float *) P_sh4;

    const int tid  = threadIdx.x;
    const int lane = tid % WARP_SIZE;
    const int warp = tid / WARP_SIZE;

    const int split = blockIdx.x;
    const int hk    = blockIdx.y / p.nrg;
    const int rg    = blockIdx.y % p.nrg;
    const int iq3   = blockIdx.z;
    const int R     = p.gqa*p.n_q;

    if (tid < 64) {
        // centroid pairs of two consecutive values: index = lo bits (2+2) | hi bits (1+1) << 4
        constexpr int kb = turbo_traits<type_K>::bits;
        if (kb == 3) {
            const int lo = tid & 15, hi = tid >> 4;
            pairK[tid] = make_float2(turbo_d_c3[(lo & 3) | ((hi & 1) << 2)], turbo_d_c3[(lo >> 2) | ((hi >> 1) << 2)]);
        } else if (kb == 2) {
            pairK[tid] = make_float2(turbo_d_c2[tid & 3], turbo_d_c2[(tid >> 2) & 3]);
        }
    }
    if (turbo_traits<type_K>::bits == 4) {
        // turbo4: a qs byte (the codes of two consecutive values) is the index
        for (int i = tid; i < 256; i += TURBO_FA_THREADS) {
            pairK[i] = make_float2(turbo_d_c4[i & 15], turbo_d_c4[i >> 4]);
        }
    }
    if (tid < 8) {
        if (turbo_traits<type_V>::bits == 3) ctabV[tid] = turbo_d_c3[tid];
        if (turbo_traits<type_V>::bits == 2) ctabV[tid] = turbo_d_c2[tid & 3];
    }
    if (turbo_traits<type_V>::bits == 4 && tid < 16) {
        ctabV[tid] = turbo_d_c4[tid];
    }
    if (tid < NCOLS) {
        const int rho = rg*NCOLS + tid;
        const int j = rho < R ? rho / p.gqa : 0;
        const int h = hk*p.gqa + (rho < R ? rho % p.gqa : 0);
        row_j_sh[tid] = j;
        slope_sh[tid] = get_alibi_slope(p.max_bias, h, p.n_head_log2, p.m0, p.m1);
        M_sh[tid] = -INFINITY;
        S_sh[tid] = 0.0f;
    }
    // load q rows (scaled; signs applied when K is turbo)
    for (int it = tid; it < NCOLS*D; it += TURBO_FA_THREADS) {
        const int r = it / D, d = it % D;
        const int rho = rg*NCOLS + r;
        float v = 0.0f;
        if (rho < R) {
            const int j = rho / p.gqa, h = hk*p.gqa + rho % p.gqa;
            v = *(const float *) (p.Q + iq3*p.nb03 + h*p.nb02 + j*p.nb01 + d*sizeof(float));
            v *= p.scale;
            if (K_turbo && turbo_sign_neg(d % QK_TURBO)) {
                v = -v;
            }
        }
        q_sh[turbo_fa_qidx<D>(r, d)] = v;
    }
    __syncthreads();
    if (K_turbo) {
        // FWHT of every 128-block of every row, then 1/sqrt(128)
#pragma unroll
        for (int h = 1; h < QK_TURBO; h *= 2) {
            for (int it = tid; it < NCOLS*D/2; it += TURBO_FA_THREADS) {
                const int r = it / (D/2), q = it % (D/2);
                const int blk = q / (QK_TURBO/2), pp = q % (QK_TURBO/2);
                const int i = blk*QK_TURBO + (pp / h)*2*h + pp % h;
                const int ia = turbo_fa_qidx<D>(r, i), ib = turbo_fa_qidx<D>(r, i + h);
                const float a = q_sh[ia], b = q_sh[ib];
                q_sh[ia] = a + b;
                q_sh[ib] = a - b;
            }
            __syncthreads();
        }
        for (int it = tid; it < NCOLS*QSTRIDE; it += TURBO_FA_THREADS) {
            q_sh[it] *= TURBO_CUDA_INV_SQRT_QK;
        }
        __syncthreads();
    }
    if (p.c0.on && split >= (int) gridDim.x - p.c0.n_extra) {   // an extra block (turbo_fa_cell0)
        turbo_fa_extra_block<D, type_K, type_V, NCOLS, TURBO_FA_THREADS, 2>(p, hk, rg, iq3,
            [&](const int r, const int d) { return q_sh[turbo_fa_qidx<D>(r, d)]; });
        return;
    }

    const int64_t k_off = (int64_t) hk*p.nb12 + (int64_t) (iq3 % p.ne13)*p.nb13;
    const int64_t v_off = (int64_t) hk*p.nb22 + (int64_t) (iq3 % p.ne23)*p.nb23;
    const char * Kb = p.K + k_off;
    const char * Vb = p.V + v_off;
    const half * maskb = p.mask ? (const half *) (p.mask + (int64_t) (iq3 % p.ne33)*p.nb33) : nullptr;

    float acc[NB][NCOLS];
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int r = 0; r < NCOLS; ++r) acc[b][r] = 0.0f;

    const int n_tiles = (p.n_kv + TURBO_FA_TILE - 1) / TURBO_FA_TILE;
    const int t_begin = split*p.tiles_per_split;
    const int t_end   = min(n_tiles, t_begin + p.tiles_per_split);

    const int kq = tid >> 2;   // key of this thread in the scores phase
    const int qq = tid & 3;    // quarter (32 values) of each 128-block it handles

    turbo_fa_pref<type_K, NB> prefK;
    turbo_fa_pref<type_V, NB> prefV;
    if (t_begin < t_end) {
        prefK.load(Kb, p.nb11, t_begin*TURBO_FA_TILE, p.n_kv);
        prefV.load(Vb, p.nb21, t_begin*TURBO_FA_TILE, p.n_kv);
    }

    for (int t = t_begin; t < t_end; ++t) {
        const int k0 = t*TURBO_FA_TILE;
        prefK.store(kw_sh, kn_sh);
        prefV.store(vw_sh, vn_sh);
        __syncthreads();
        if (t + 1 < t_end) {
            prefK.load(Kb, p.nb11, k0 + TURBO_FA_TILE, p.n_kv);
            prefV.load(Vb, p.nb21, k0 + TURBO_FA_TILE, p.n_kv);
        }

        // ---- scores: 4 threads per key, one quarter of every 128-block each
        {
            const int k = k0 + kq;
            float s[NCOLS];
#pragma unroll
            for (int r = 0; r < NCOLS; ++r) s[r] = 0.0f;
            if (k < p.n_kv) {
#pragma unroll
                for (int b = 0; b < NB; ++b) {
                    float bs[NCOLS];
#pragma unroll
                    for (int r = 0; r < NCOLS; ++r) bs[r] = 0.0f;
                    const int e0 = b*QK_TURBO + qq*32;
                    if constexpr (K_turbo) {
                        constexpr int bits = turbo_traits<type_K>::bits;
                        const uint32_t * w = kw_sh + kq*KSTRIDE + b*KQSW;
                        const uint32_t lo0 = w[bits == 4 ? 0 : 2*qq], lo1 = w[bits == 4 ? 0 : 2*qq + 1];
                        const uint32_t hi  = bits == 3 ? w[8 + qq] : 0u;
#pragma unroll
                        for (int j = 0; j < 16; ++j) {
                            const uint32_t lo = j < 8 ? lo0 : lo1;
                            int idx = (lo >> (4*(j & 7))) & 15;
                            if (bits == 3) {
                                idx |= ((hi >> (2*j)) & 3) << 4;
                            }
                            if (bits == 4) {   // turbo4: byte j of the quarter's 16 bytes (values 2j, 2j + 1)
                                idx = (w[4*qq + (j >> 2)] >> (8*(j & 3))) & 255;
                            }
                            const float2 c = pairK[idx];
#pragma unroll
                            for (int r = 0; r < NCOLS; ++r) {
                                const float2 qv = *(const float2 *) (q_sh + turbo_fa_qidx<D>(r, e0 + 2*j));
                                bs[r] += qv.x*c.x + qv.y*c.y;
                            }
                        }
                        const float n = kn_sh[kq*NB + b];
#pragma unroll
                        for (int r = 0; r < NCOLS; ++r) s[r] += bs[r]*n;
                    } else if constexpr (type_K == GGML_TYPE_F16) {
                        const half2 * kr = (const half2 *) (Kb + (int64_t) k*p.nb11) + e0/2;
#pragma unroll 4
                        for (int j = 0; j < 16; ++j) {
                            const float2 kv = __half22float2(kr[j]);
#pragma unroll
                            for (int r = 0; r < NCOLS; ++r) {
                                const float2 qv = *(const float2 *) (q_sh + turbo_fa_qidx<D>(r, e0 + 2*j));
                                bs[r] += qv.x*kv.x + qv.y*kv.y;
                            }
                        }
#pragma unroll
                        for (int r = 0; r < NCOLS; ++r) s[r] += bs[r];
                    } else { // Q8_0: the quarter is exactly one q8_0 block
                        const block_q8_0 * kr = (const block_q8_0 *) (Kb + (int64_t) k*p.nb11) + e0/QK8_0;
                        const float dd = __half2float(kr->d);
#pragma unroll 8
                        for (int i = 0; i < QK8_0; ++i) {
                            const float kv = (float) kr->qs[i];
#pragma unroll
                            for (int r = 0; r < NCOLS; ++r) bs[r] += q_sh[turbo_fa_qidx<D>(r, e0 + i)]*kv;
                        }
#pragma unroll
                        for (int r = 0; r < NCOLS; ++r) s[r] += bs[r]*dd;
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < NCOLS; ++r) {
                s[r] += __shfl_xor_sync(0xffffffff, s[r], 1);
                s[r] += __shfl_xor_sync(0xffffffff, s[r], 2);
            }
            if (qq == 0) {
#pragma unroll
                for (int r = 0; r < NCOLS; ++r) {
                    float v = -INFINITY;
                    if (k < p.n_kv) {
                        v = s[r];
                        if (p.logit_softcap != 0.0f) {
                            v = p.logit_softcap*tanhf(v/p.logit_softcap);
                        }
                        if (maskb) {
                            v += slope_sh[r]*__half2float(maskb[(int64_t) row_j_sh[r]*(p.nb31/sizeof(half)) + k]);
                        }
                    }
                    S_tile[kq*NCOLS + r] = v;
                }
            }
        }
        __syncthreads();

        // ---- online softmax: warp w handles rows w, w + 4; lane = key
        for (int r = warp; r < NCOLS; r += TURBO_FA_THREADS/WARP_SIZE) {
            const float v = S_tile[lane*NCOLS + r];
            const float mx = warp_reduce_max(v);
            const float M_old = M_sh[r];
            const float M_new = fmaxf(M_old, mx);
            const float e = M_new == -INFINITY ? 0.0f : expf(v - M_new);
            const float sum = warp_reduce_sum(e);
#pragma unroll
            for (int b = 0; b < NPB; ++b) {
                P_sh[(b*TURBO_FA_TILE + lane)*NCOLS + r] = V_turbo ? e*vn_sh[lane*NB + b] : e;
            }
            if (lane == 0) {
                const float alpha = M_old == -INFINITY ? 0.0f : expf(M_old - M_new);
                A_sh[r] = alpha;
                S_sh[r] = S_sh[r]*alpha + sum;
                M_sh[r] = M_new;
            }
        }
        __syncthreads();

        // ---- V: thread tid owns value tid of each 128-block
        {
#pragma unroll
            for (int r = 0; r < NCOLS; ++r) {
                const float a = A_sh[r];
#pragma unroll
                for (int b = 0; b < NB; ++b) acc[b][r] *= a;
            }
            const int nk = min(TURBO_FA_TILE, p.n_kv - k0);
            if constexpr (V_turbo) {
                constexpr int bits = turbo_traits<type_V>::bits;
#pragma unroll 4
                for (int kk = 0; kk < nk; ++kk) {
#pragma unroll
                    for (int b = 0; b < NB; ++b) {
                        const float c = ctabV[turbo_fa_code<bits>(vw_sh + kk*VSTRIDE + b*VQSW, tid)];
#pragma unroll
                        for (int r4 = 0; r4 < NCOLS/4; ++r4) {
                            const float4 pv = P_sh4[((b*TURBO_FA_TILE + kk)*NCOLS)/4 + r4];
                            acc[b][4*r4 + 0] += pv.x*c; acc[b][4*r4 + 1] += pv.y*c;
                            acc[b][4*r4 + 2] += pv.z*c; acc[b][4*r4 + 3] += pv.w*c;
                        }
                    }
                }
            } else if constexpr (type_V == GGML_TYPE_F16) {
                for (int kk = 0; kk < nk; ++kk) {
                    const half * vr = (const half *) (Vb + (int64_t) (k0 + kk)*p.nb21);
#pragma unroll
                    for (int b = 0; b < NB; ++b) {
                        const float vv = __half2float(vr[b*QK_TURBO + tid]);
#pragma unroll
                        for (int r = 0; r < NCOLS; ++r) acc[b][r] += P_sh[kk*NCOLS + r]*vv;
                    }
                }
            } else { // Q8_0
                for (int kk = 0; kk < nk; ++kk) {
                    const block_q8_0 * vr = (const block_q8_0 *) (Vb + (int64_t) (k0 + kk)*p.nb21);
#pragma unroll
                    for (int b = 0; b < NB; ++b) {
                        const int d = b*QK_TURBO + tid;
                        const float vv = __half2float(vr[d/QK8_0].d)*(float) vr[d/QK8_0].qs[d%QK8_0];
#pragma unroll
                        for (int r = 0; r < NCOLS; ++r) acc[b][r] += P_sh[kk*NCOLS + r]*vv;
                    }
                }
            }
        }
        __syncthreads();
    }

    // ---- partial results of this split
    const int64_t slot = ((int64_t) (iq3*gridDim.y + blockIdx.y))*p.n_split + split;
#pragma unroll
    for (int r = 0; r < NCOLS; ++r) {
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            p.part_acc[(slot*NCOLS + r)*D + b*QK_TURBO + tid] = acc[b][r];
        }
    }
    if (tid < NCOLS) {
        p.part_meta[slot*NCOLS + tid] = make_float2(M_sh[tid], S_sh[tid]);
    }
}

// the output row of a merge block (blockIdx: row in the group, KV head x row group, dim 3): its query j, head h
// and first split slot; ok is false past the group's last row
struct turbo_combine_row {
    bool ok;
    int j, h;
    int64_t slot0;
};
template <int NCOLS>
static __device__ __forceinline__ turbo_combine_row turbo_combine_row_of(const int n_split, const int nrg, const int gqa, const int n_q) {
    const int y = blockIdx.y, iq3 = blockIdx.z;
    const int hk = y / nrg, rg = y % nrg;
    const int rho = rg*NCOLS + blockIdx.x;
    turbo_combine_row row;
    row.ok = rho < gqa*n_q;
    row.j = rho / gqa;
    row.h = hk*gqa + rho % gqa;
    row.slot0 = ((int64_t) (iq3*gridDim.y + y))*n_split;
    return row;
}

// the merged, normalised values of NV elements of one output row: the splits' partial sums weighted by
// exp(max - overall max), the sink's term in the denominator. meta(s) gives split s's (max in base e, sum),
// acc(s) a pointer to its first element (the others at stride): the global partials, or the warps' sums in shared memory
template <int NV, typename meta_t, typename acc_t>
static __device__ __forceinline__ void turbo_fattn_merge_splits(const meta_t & meta, const acc_t & acc, const int n_split,
        const int stride, const float * sinks, const int h, float v[NV]) {
    float M = -INFINITY;
    for (int s = 0; s < n_split; ++s) {
        M = fmaxf(M, meta(s).x);
    }
    const float sink = sinks ? sinks[h] : -INFINITY;
    M = fmaxf(M, sink);
    float S = 0.0f, a[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        a[k] = 0.0f;
    }
    if (M != -INFINITY) {
        for (int s = 0; s < n_split; ++s) {
            const float2 ms = meta(s);
            if (ms.x == -INFINITY) {
                continue;
            }
            const float f = expf(ms.x - M);
            S += ms.y*f;
            const float * x = acc(s);
#pragma unroll
            for (int k = 0; k < NV; ++k) {
                a[k] += x[k*stride]*f;
            }
        }
        if (sinks) {
            S += expf(sink - M);
        }
    }
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        v[k] = S > 0.0f ? a[k]/S : 0.0f;
    }
}

// one QKB-block (V's block: 128, or 64 for the 64-value types) of an output row from the warp's merged values (value
// lane + 32k): the inverse rotation for a turbo V (the same float operations as the C reference's butterflies), then
// the store
template <int QKB, bool V_turbo>
static __device__ __forceinline__ void turbo_fattn_store_block(float * out, float v[QKB/WARP_SIZE], const int lane) {
    constexpr int NV = QKB/WARP_SIZE;
    if (V_turbo) {
        if constexpr (QKB == QK_TURBO_64) {
            turbo64_warp_fwht(v, lane);
        } else {
            turbo_warp_fwht(v, lane);
        }
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            v[k] *= QKB == QK_TURBO_64 ? TURBO64_INV_SQRT : TURBO_CUDA_INV_SQRT_QK;
            if (turbo_sign_neg(lane + 32*k)) {
                v[k] = -v[k];
            }
        }
    }
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        out[lane + 32*k] = v[k];
    }
}

// merges the splits of one output row, applies the sink and the inverse rotation (turbo V), writes dst: one warp per
// QKB-block of the row, QKB/32 values per lane, the FWHT by shuffles (no shared-memory butterflies and barriers); at
// depth 0 the merge is a launch per layer on the decode step's critical path
template <int D, int QKB, bool V_turbo, int NCOLS>
__launch_bounds__(D/QKB*WARP_SIZE)
static __global__ void k_turbo_fattn_combine_warp(const float * part_acc, const float2 * part_meta,
        const float * sinks, float * dst, const int n_split, const int nrg, const int gqa,
        const int n_q, const int n_head) {
    ggml_cuda_pdl_sync();   // under PDL: the partials of the attention kernel before (plain pointers: no __restrict__ with PDL)
    ggml_cuda_pdl_lc();
    const int lane = threadIdx.x % WARP_SIZE;
    const int blk  = threadIdx.x / WARP_SIZE;   // QKB-block of the row
    const turbo_combine_row row = turbo_combine_row_of<NCOLS>(n_split, nrg, gqa, n_q);
    if (!row.ok) {
        return;
    }
    const int r = blockIdx.x;
    auto meta = [&](const int s) { return part_meta[(row.slot0 + s)*NCOLS + r]; };
    auto acc  = [&](const int s) { return part_acc + ((row.slot0 + s)*NCOLS + r)*D + blk*QKB + lane; };
    float v[QKB/WARP_SIZE];
    turbo_fattn_merge_splits<QKB/WARP_SIZE>(meta, acc, n_split, 32, sinks, row.h, v);
    turbo_fattn_store_block<QKB, V_turbo>(dst + (((int64_t) blockIdx.z*n_q + row.j)*n_head + row.h)*D + blk*QKB, v, lane);
}

// The split merge for many splits (from 8 splits up; below, the one-warp merge above). At 32K and 128K keys a row has
// ~50 splits, and the one-warp merge above walks them in rounds of 4 whose value loads wait for the metas (the -inf
// test): two dependent trips to L2 per round, several times the merge's cost at depth 0. Here TURBO_COMBINE_WARPS
// warps take the splits in turn; a warp loads
// the metas and values of up to TURBO_COMBINE_UNROLL of its splits at once (no load waits for another), merges
// them against its own running maximum, and the block merges the warps' results through shared memory; then one
// warp per 128-block applies the inverse rotation and stores, as turbo_fattn_store_block does. The summation order
// differs from the merges above (the tests compare within tolerance, not bits).
#define TURBO_COMBINE_WARPS  8
#define TURBO_COMBINE_UNROLL 8
template <int D, int QKB, bool V_turbo, int NCOLS>
__launch_bounds__(TURBO_COMBINE_WARPS*WARP_SIZE)
static __global__ void k_turbo_fattn_combine_par(const float * part_acc, const float2 * part_meta,
        const float * sinks, float * dst, const int n_split, const int nrg, const int gqa,
        const int n_q, const int n_head) {
    constexpr int NW = TURBO_COMBINE_WARPS, U = TURBO_COMBINE_UNROLL, NV = D/WARP_SIZE;
    __shared__ float wm[NW], ws[NW];
    __shared__ float wa[NW][D];
    ggml_cuda_pdl_sync();   // under PDL: the partials of the attention kernel before (plain pointers: no __restrict__ with PDL)
    ggml_cuda_pdl_lc();
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const turbo_combine_row row = turbo_combine_row_of<NCOLS>(n_split, nrg, gqa, n_q);
    if (!row.ok) {
        return;   // the whole block
    }
    const int r = blockIdx.x;
    float M = -INFINITY, S = 0.0f, a[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        a[k] = 0.0f;
    }
    for (int s0 = warp; s0 < n_split; s0 += NW*U) {
        float2 ms[U];
        float  x[U][NV];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int  s  = s0 + u*NW;
            const bool ok = s < n_split;
            const int64_t slot = (row.slot0 + (ok ? s : 0))*NCOLS + r;
            ms[u] = ok ? part_meta[slot] : make_float2(-INFINITY, 0.0f);
#pragma unroll
            for (int k = 0; k < NV; ++k) {
                x[u][k] = ok ? part_acc[slot*D + lane + WARP_SIZE*k] : 0.0f;
            }
        }
        float mx = M;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            mx = fmaxf(mx, ms[u].x);
        }
        if (mx == -INFINITY) {
            continue;   // no key in these splits (warp-uniform)
        }
        const float c = expf(M - mx);   // 0 while M is -inf (S and a are 0 then)
        S *= c;
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            a[k] *= c;
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (ms[u].x != -INFINITY) {   // an empty split's values are never read into the sums
                const float f = expf(ms[u].x - mx);
                S += ms[u].y*f;
#pragma unroll
                for (int k = 0; k < NV; ++k) {
                    a[k] += x[u][k]*f;
                }
            }
        }
        M = mx;
    }
    if (lane == 0) {
        wm[warp] = M;
        ws[warp] = S;
    }
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        wa[warp][lane + WARP_SIZE*k] = a[k];
    }
    __syncthreads();
    if (warp >= D/QKB) {
        return;
    }
    // warp b: the QKB-block b of the row (value lane + 32k), merged over the warps as the one-warp merge merges splits
    auto meta = [&](const int w) { return make_float2(wm[w], ws[w]); };
    auto acc  = [&](const int w) { return &wa[w][warp*QKB + lane]; };
    float v[QKB/WARP_SIZE];
    turbo_fattn_merge_splits<QKB/WARP_SIZE>(meta, acc, NW, WARP_SIZE, sinks, row.h, v);
    turbo_fattn_store_block<QKB, V_turbo>(dst + (((int64_t) blockIdx.z*n_q + row.j)*n_head + row.h)*D + warp*QKB, v, lane);
}

// launches k_turbo_fattn for one K type (instantiated in fattn-turbo-k*.cu, one file per K type for build parallelism)
template <ggml_type type_K>
void ggml_cuda_turbo_fattn_launch(cudaStream_t stream, const int D, const ggml_type type_V, const int ncols,
        const turbo_fa_params & p, const dim3 grid) {
#define TURBO_FA_CASE(DD, TYPE_V, NC)                                                              \
    if (D == DD && type_V == TYPE_V && ncols == NC) {                                              \
        k_turbo_fattn<DD, type_K, TYPE_V, NC><<<grid, TURBO_FA_THREADS, 0, stream>>>(p);           \
        return;                                                                                    \
    }
#define TURBO_FA_CASES_V(TYPE_V) \
    TURBO_FA_CASE(128, TYPE_V, 4) TURBO_FA_CASE(128, TYPE_V, 8) TURBO_FA_CASE(256, TYPE_V, 4) TURBO_FA_CASE(256, TYPE_V, 8)
    // (turbo4 K with a turbo V, and q8_0 K with turbo4 V at D = 128, run on the tensor cores only: no instance here)
    if constexpr (type_K != GGML_TYPE_TURBO4) {
        TURBO_FA_CASES_V(GGML_TYPE_TURBO3)
        TURBO_FA_CASES_V(GGML_TYPE_TURBO2)
    }
    if constexpr (ggml_cuda_turbo_qk(type_K) == QK_TURBO) {
        TURBO_FA_CASES_V(GGML_TYPE_F16)
        TURBO_FA_CASES_V(GGML_TYPE_Q8_0)
    } else {
        TURBO_FA_CASES_V(GGML_TYPE_TURBO4)
    }
#undef TURBO_FA_CASES_V
#undef TURBO_FA_CASE
    GGML_ABORT("turbo flash attention: K/V pair or head size not compiled");
}

// K types and V types of the fused kernels (at least one of the two turbo; which turbo4 pairs: see
// ggml_cuda_turbo_fattn_pair_supported)
static inline bool ggml_cuda_turbo_fattn_k_type(ggml_type t) {
    return t == GGML_TYPE_F16 || t == GGML_TYPE_Q8_0 || t == GGML_TYPE_TURBO3 || t == GGML_TYPE_TURBO2 || t == GGML_TYPE_TURBO4;
}

extern template void ggml_cuda_turbo_fattn_launch<GGML_TYPE_F16>   (cudaStream_t, int, ggml_type, int, const turbo_fa_params &, dim3);
extern template void ggml_cuda_turbo_fattn_launch<GGML_TYPE_Q8_0>  (cudaStream_t, int, ggml_type, int, const turbo_fa_params &, dim3);
extern template void ggml_cuda_turbo_fattn_launch<GGML_TYPE_TURBO3>(cudaStream_t, int, ggml_type, int, const turbo_fa_params &, dim3);
extern template void ggml_cuda_turbo_fattn_launch<GGML_TYPE_TURBO2>(cudaStream_t, int, ggml_type, int, const turbo_fa_params &, dim3);
extern template void ggml_cuda_turbo_fattn_launch<GGML_TYPE_TURBO4>(cudaStream_t, int, ggml_type, int, const turbo_fa_params &, dim3);
