// turbo-llama: write path (SET_ROWS, CPY to turbo) and read path (GET_ROWS, CPY from turbo, to_fp16/fp32)
// for the turbo KV-cache types: turbo4/turbo3/turbo2 (128-value blocks) and their 64-value forms turbo4_64/turbo3_64/
// turbo2_64 (head_dim 64 models; cpu_ref/ggml-turbo.h's "64-value blocks"). Each kernel is one template over the block
// size, one warp per block (lane l holds values l + 32k), its per-block work turbo-common.cuh's warp helpers of that
// size; bit-exact with cpu_ref/ggml-turbo.c. (The 2-thread bulk write, turbo-encode-t2.cuh, is the 128-value types'.)
#include "turbo-common.cuh"
#include "turbo.cuh"
#include "turbo-encode-t2.cuh"
#include "turbo-codebooks.h"
#include "turbo-codebooks-64.h"

#include <cstring>

#define TURBO_WARPS_PER_BLOCK 8

void ggml_cuda_turbo_check_tables(void) {
    static bool checked = false;
    if (checked) {
        return;
    }
    const unsigned int sw[4] = TURBO_CUDA_SIGN_WORDS;
    const float c3[8] = TURBO_CUDA_C3, b3[7] = TURBO_CUDA_B3, c2[4] = TURBO_CUDA_C2, b2[3] = TURBO_CUDA_B2;
    const float c4[16] = TURBO_CUDA_C4, b4[15] = TURBO_CUDA_B4;
    if (memcmp(sw, turbo_sign_words, sizeof(sw)) != 0 || memcmp(c3, turbo3_centroids, sizeof(c3)) != 0 ||
        memcmp(b3, turbo3_boundaries, sizeof(b3)) != 0 || memcmp(c2, turbo2_centroids, sizeof(c2)) != 0 ||
        memcmp(b2, turbo2_boundaries, sizeof(b2)) != 0 || memcmp(c4, turbo4_centroids, sizeof(c4)) != 0 ||
        memcmp(b4, turbo4_boundaries, sizeof(b4)) != 0) {
        GGML_ABORT("turbo-llama: the CUDA copies of the turbo codebooks/signs differ from turbo-codebooks.h");
    }
    // the 2-thread write's code search (turbo-encode-t2.cuh) needs symmetric codebooks around a boundary at 0
    bool sym = b3[3] == 0.0f && b2[1] == 0.0f;
    for (int k = 0; k < 8; ++k) { sym = sym && c3[7 - k] == -c3[k]; }
    for (int k = 0; k < 7; ++k) { sym = sym && b3[6 - k] == -b3[k]; }
    for (int k = 0; k < 4; ++k) { sym = sym && c2[3 - k] == -c2[k]; }
    for (int k = 0; k < 3; ++k) { sym = sym && b2[2 - k] == -b2[k]; }
    // (turbo4's symmetry: the tensor-core decode and the writes do not rely on it; checked all the same, as the format
    // defines it so)
    sym = sym && b4[7] == 0.0f;
    for (int k = 0; k < 16; ++k) { sym = sym && c4[15 - k] == -c4[k]; }
    for (int k = 0; k < 15; ++k) { sym = sym && b4[14 - k] == -b4[k]; }
    if (!sym) {
        GGML_ABORT("turbo-llama: the turbo codebooks are not symmetric, which the CUDA write assumes");
    }
    // the 64-value blocks' codebooks (their signs: the first two sign words)
    const float c3_64[8] = TURBO64_CUDA_C3, b3_64[7] = TURBO64_CUDA_B3, c2_64[4] = TURBO64_CUDA_C2, b2_64[3] = TURBO64_CUDA_B2;
    const float c4_64[16] = TURBO64_CUDA_C4, b4_64[15] = TURBO64_CUDA_B4;
    if (memcmp(c3_64, turbo3_64_centroids, sizeof(c3_64)) != 0 || memcmp(b3_64, turbo3_64_boundaries, sizeof(b3_64)) != 0 ||
        memcmp(c2_64, turbo2_64_centroids, sizeof(c2_64)) != 0 || memcmp(b2_64, turbo2_64_boundaries, sizeof(b2_64)) != 0 ||
        memcmp(c4_64, turbo4_64_centroids, sizeof(c4_64)) != 0 || memcmp(b4_64, turbo4_64_boundaries, sizeof(b4_64)) != 0) {
        GGML_ABORT("turbo-llama: the CUDA copies of the 64-value turbo codebooks differ from turbo-codebooks-64.h");
    }
    checked = true;
}

static inline dim3 turbo_grid(int64_t nblk) {
    return dim3((unsigned) ((nblk + TURBO_WARPS_PER_BLOCK - 1) / TURBO_WARPS_PER_BLOCK));
}

template <typename T> static __device__ __forceinline__ float turbo_to_f32(T x) { return (float) x; }
template <> __device__ __forceinline__ float turbo_to_f32<half>(half x) { return __half2float(x); }
template <typename T> static __device__ __forceinline__ T turbo_from_f32(float x) { return (T) x; }
template <> __device__ __forceinline__ half turbo_from_f32<half>(float x) { return __float2half_rn(x); }

// One warp per block of qk values (QK_TURBO, or QK_TURBO_64 for the 64-value types) in the kernels below; lane l holds
// the values l + 32k, nv = qk/32 of them. The block's encode, store and decode: turbo-common.cuh's warp helpers of that
// block size
template <int bits, int qk>
static __device__ __forceinline__ uint16_t turbo_warp_encode_qk(const float v[qk/WARP_SIZE], int codes[qk/WARP_SIZE],
        const int lane) {
    if constexpr (qk == QK_TURBO_64) {
        return turbo64_warp_encode<bits>(v, codes, lane);
    } else {
        return turbo_warp_encode<bits>(v, codes, lane);
    }
}

template <int bits, int qk>
static __device__ __forceinline__ void turbo_warp_store_qk(uint8_t * blk, const uint16_t h, const int codes[qk/WARP_SIZE],
        const int lane) {
    if constexpr (qk == QK_TURBO_64) {
        turbo64_warp_store<bits>(blk, h, codes, lane);
    } else {
        turbo_warp_store<bits>(blk, h, codes, lane);
    }
}

template <int bits, int qk>
static __device__ __forceinline__ void turbo_warp_decode_qk(const uint8_t * blk, float v[qk/WARP_SIZE], const int lane) {
    if constexpr (qk == QK_TURBO_64) {
        turbo64_warp_decode<bits>(blk, v, lane);
    } else {
        turbo_warp_decode<bits>(blk, v, lane);
    }
}

// ---- SET_ROWS -------------------------------------------------------------------------------------

// one SET_ROWS into a turbo tensor, as the kernel sees it (element strides of src0 and src1, byte strides of dst)
struct turbo_set_rows_job {
    const void * src0; const void * src1; char * dst;
    int nblk, nbr, ne01, ne02, ne11, ne12, bs;
    int64_t s01, s02, s03, s10, s11, s12;
    size_t nb1, nb2, nb3;
    const float * off;   // the key offset row subtracted on load (fused SUB), or nullptr
    turbo_rope rope;     // RoPE applied before the offset (fused ROPE), rope.pos == nullptr when none
    uint3 fd_nbr, fd_ne01, fd_ne02, fd_ne11, fd_ne12;   // fastdiv values of those extents (turbo_job_locate)
    // cell 0's exact rows (ggml_set_rows_cell0: dst's src[3], one row of c0_ne0 floats per stream of fd_kv.z rows),
    // or nullptr: a row stored into a destination row r with r % kv_size == 0 also goes to row r / kv_size of c0
    float * c0;
    int64_t c0_ne0;
    uint3 fd_kv;
    // the recent window (ggml_set_rows_ring: dst's src[4], Q8_0 [ne0, R, n_stream]), or nullptr: a row stored into
    // destination row s*kv_size + c also goes, rotated as cell 0's rows and as q8_0, to row c % R of stream s
    char * ring;
    size_t ring_nb1, ring_nb2;
    uint3 fd_ring_kv, fd_ring_R;   // kv_size and R
};

// the warp's qk values (value lane + 32k) rotated as the decoder's output is (H D x, H normalized: the same float
// operations as turbo_rotate_forward_qk), into t (the same layout)
template <int qk>
static __device__ __forceinline__ void turbo_warp_rotated(const float v[qk/WARP_SIZE], float t[qk/WARP_SIZE], const int lane) {
    if constexpr (qk == QK_TURBO_64) {
        t[0] = v[0];
        t[1] = v[1];
        turbo64_warp_rotate(t, lane);
    } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            t[k] = turbo_sign_neg(lane + 32*k) ? -v[k] : v[k];
        }
        turbo_warp_fwht(t, lane);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            t[k] = __fmul_rn(t[k], TURBO_CUDA_INV_SQRT_QK);
        }
    }
}

// ... stored at y: cell 0's exact block (ggml_set_rows_cell0)
template <int qk>
static __device__ __forceinline__ void turbo_warp_store_rotated(float * y, const float v[qk/WARP_SIZE], const int lane) {
    float t[qk/WARP_SIZE];
    turbo_warp_rotated<qk>(v, t, lane);
#pragma unroll
    for (int k = 0; k < qk/WARP_SIZE; ++k) {
        y[lane + 32*k] = t[k];
    }
}

// ... stored as qk/32 q8_0 blocks at y (value lane + 32k is qs[lane] of block k): the ring's row (ggml_set_rows_ring),
// the float operations of quantize_row_q8_0_ref (explicitly rounded: fast math)
// a staged row of QK_TURBO values less the key offset (offb may be null), 4 per lane as the warp stores take them
static __device__ __forceinline__ void turbo_warp_staged_values(const float * xr, const float * offb, const int lane, float v[4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        v[k] = offb ? __fsub_rn(xr[lane + 32*k], offb[lane + 32*k]) : xr[lane + 32*k];
    }
}

template <int qk>
static __device__ __forceinline__ void turbo_warp_store_ring(block_q8_0 * y, const float v[qk/WARP_SIZE], const int lane) {
    float t[qk/WARP_SIZE];
    turbo_warp_rotated<qk>(v, t, lane);
#pragma unroll
    for (int k = 0; k < qk/WARP_SIZE; ++k) {
        const float amax = warp_reduce_max(fabsf(t[k]));
        const float d  = __fdiv_rn(amax, 127.0f);
        const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
        y[k].qs[lane] = (int8_t) roundf(__fmul_rn(t[k], id));
        if (lane == 0) {
            y[k].d = __float2half_rn(d);
        }
    }
}

// where block ib (of qk values) of a row stored into destination row dst_row goes in cell 0's rows, or nullptr when
// that row is not a cell 0 (or the job has no cell 0 rows)
template <int qk>
static __device__ __forceinline__ float * turbo_job_cell0(const turbo_set_rows_job & j, const int64_t dst_row, const int ib) {
    if (!j.c0) {
        return nullptr;
    }
    const uint2 qr = fast_div_modulo((uint32_t) dst_row, j.fd_kv);   // (stream, cell)
    return qr.y == 0 ? j.c0 + (int64_t) qr.x*j.c0_ne0 + ib*qk : nullptr;
}

// where block ib (of qk values) of a row stored into destination row dst_row goes in the ring (its qk/32 q8_0 blocks),
// or nullptr when the job has no ring
template <int qk>
static __device__ __forceinline__ block_q8_0 * turbo_job_ring(const turbo_set_rows_job & j, const int64_t dst_row, const int ib) {
    if (!j.ring) {
        return nullptr;
    }
    const uint2 qr = fast_div_modulo((uint32_t) dst_row, j.fd_ring_kv);   // (stream, cell)
    return (block_q8_0 *) (j.ring + qr.x*j.ring_nb2 + fastmodulo(qr.y, j.fd_ring_R)*j.ring_nb1) + ib*(qk/QK8_0);
}

// one warp per block of src0 (qk = 128 values, or 64 for the 64-value types): rows go to the dst rows that src1 names
template <typename src_t, typename idx_t, int bits, int qk>
static __device__ __forceinline__ void turbo_set_rows_block(const turbo_set_rows_job & j, const int wid, const int lane) {
    constexpr int nv = qk/WARP_SIZE;   // values per lane
    const turbo_block_pos pos = turbo_block_at(wid, j.nbr, j.ne01, j.ne02);
    const int ib = pos.ib, i01 = pos.i1, i02 = pos.i2, i03 = pos.i3;
    const int i12 = i03 % j.ne12;
    const int i11 = i02 % j.ne11;
    const int64_t dst_row = (int64_t) ((const idx_t *) j.src1)[i01*j.s10 + i11*j.s11 + i12*j.s12];

    const src_t * x = (const src_t *) j.src0 + i01*j.s01 + i02*j.s02 + i03*j.s03 + ib*qk;
    // every global value the block needs is loaded here, together (the RoPE's MUL row and frequency factors, the key
    // offsets): read where they are used, each was a trip to L2 of its own inside the chain
    float v[nv], offv[nv];
    turbo_rope_pre<nv> rpre;
    const int e0 = j.rope.pos ? (ib*qk) % j.rope.D : 0;
#pragma unroll
    for (int k = 0; k < nv; ++k) {
        v[k] = turbo_to_f32(x[lane + 32*k]);
        offv[k] = j.off ? j.off[ib*qk + lane + 32*k] : 0.0f;
    }
    if (j.rope.pos) {
        turbo_rope_preload<nv>(j.rope, e0, lane, rpre);
        turbo_rope_block<nv>(j.rope, v, e0, j.rope.pos[i01], rpre, lane);
    }
#pragma unroll
    for (int k = 0; k < nv; ++k) {
        if (j.off) {
            v[k] = __fsub_rn(v[k], offv[k]);   // ggml_sub's a - b, fused (see below)
        }
    }
    float * c0 = turbo_job_cell0<qk>(j, dst_row, ib);   // warp-uniform
    if (c0) {
        turbo_warp_store_rotated<qk>(c0, v, lane);
    }
    block_q8_0 * rb = turbo_job_ring<qk>(j, dst_row, ib);   // warp-uniform
    if (rb) {
        turbo_warp_store_ring<qk>(rb, v, lane);
    }
    int codes[nv];
    const uint16_t h = turbo_warp_encode_qk<bits, qk>(v, codes, lane);
    turbo_warp_store_qk<bits, qk>((uint8_t *) (j.dst + dst_row*j.nb1 + i02*j.nb2 + i03*j.nb3 + ib*j.bs), h, codes, lane);
}

// where block blk of job j comes from and goes to (f32 rows; the offset row of its 128 columns, or nullptr), for the
// 2-thread kernel; the position as turbo_block_at, by multiplications (fastdiv: the divisions were ~100
// instructions per thread)
template <typename idx_t>
static __device__ __forceinline__ void turbo_job_locate(const turbo_set_rows_job & j, const int blk, const float * & src,
        uint8_t * & dst, const float * & off, float * & c0, block_q8_0 * & rb) {
    const uint2 q0 = fast_div_modulo((uint32_t) blk, j.fd_nbr);    // (row, block of the row)
    const uint2 q1 = fast_div_modulo(q0.x, j.fd_ne01);             // (i2 and i3, i1)
    const uint2 q2 = fast_div_modulo(q1.x, j.fd_ne02);             // (i3, i2)
    const int ib = (int) q0.y, i1 = (int) q1.y, i2 = (int) q2.y, i3 = (int) q2.x;
    const int i11 = (int) fastmodulo((uint32_t) i2, j.fd_ne11), i12 = (int) fastmodulo((uint32_t) i3, j.fd_ne12);
    const int64_t dst_row = (int64_t) ((const idx_t *) j.src1)[i1*j.s10 + i11*j.s11 + i12*j.s12];
    src = (const float *) j.src0 + i1*j.s01 + i2*j.s02 + i3*j.s03 + ib*QK_TURBO;
    dst = (uint8_t *) (j.dst + dst_row*j.nb1 + i2*j.nb2 + i3*j.nb3 + ib*j.bs);
    off = j.off ? j.off + ib*QK_TURBO : nullptr;
    c0 = turbo_job_cell0<QK_TURBO>(j, dst_row, ib);
    rb = turbo_job_ring<QK_TURBO>(j, dst_row, ib);
}

// ---- two threads per block (turbo-encode-t2.cuh; large writes) -------------------------------------------------
// (fewer instructions per value than the warp kernel or 4 threads per block: the shuffles mostly go)
// A warp's 16 blocks are staged in shared memory first, each block's 512 bytes copied by the whole warp with one
// coalesced 16-byte copy per lane; then both threads of a pair read their block (rows of 132 floats: the float4s
// that the warp's 16 pairs read at once fall into 8 different bank groups, the fewest wavefronts for 256 bytes).
#define TURBO_T2_WARPS 4
#define TURBO_T2_ROW   (QK_TURBO + 4)
#define TURBO_T2_PER_WARP (WARP_SIZE/2)   // blocks per warp

// the pair's block (staged row xs) encoded and stored; dst == nullptr: no block here (the lane still takes part in
// the pair's shuffles). OFF: the job subtracts a key offset (off, 16-byte aligned)
template <int bits, bool OFF>
static __device__ __forceinline__ void turbo_t2_encode_store(const float * xs, const float * off, const float * c2tab,
        uint8_t * dst, const int par) {
    turbo_t2_out o;
    const bool fast = turbo_t2_encode_fast<bits, OFF>(xs, off, c2tab, par, o);
    if (!dst) {
        return;
    }
    if (fast) {
        turbo_t2_store<bits>(dst, o, par);
    } else if (par == 0) {
        turbo_t2_encode_slow<bits>(xs, OFF ? off : nullptr, dst);
    }
}

// the warp's pairs of job j (member: this pair's block is j's), every lane taking part
template <int bits>
static __device__ __forceinline__ void turbo_t2_run(const turbo_set_rows_job & j, const bool member, const float * row,
        const float * off, const float * c2tab, uint8_t * dst, const int par) {
    if (j.off) {
        turbo_t2_encode_store<bits, true>(row, member ? off : j.off, c2tab, member ? dst : nullptr, par);
    } else {
        turbo_t2_encode_store<bits, false>(row, nullptr, c2tab, member ? dst : nullptr, par);
    }
}

// job a, then job b, a block per pair of threads (f32 rows, 16-byte aligned, no RoPE: checked by the host).
// The kernel is latency-bound (issue slots mostly idle, under one eligible warp per scheduler) and a prompt's write is
// one wave, so capping the registers for a fifth CUDA block per SM does not help: the SMs have no more blocks to run
template <typename idx_t, int bits_a, int bits_b>
__launch_bounds__(TURBO_T2_WARPS*WARP_SIZE)
static __global__ void k_turbo_set_rows_t2(const turbo_set_rows_job a, const turbo_set_rows_job b) {
    __shared__ __align__(16) float xs[TURBO_T2_WARPS][TURBO_T2_PER_WARP][TURBO_T2_ROW];
    __shared__ const float * srcs[TURBO_T2_WARPS][TURBO_T2_PER_WARP];
    __shared__ float c2s[TURBO_T2_WARPS][8];   // each warp's tables of the centroids' squares: job a's, then job b's
    const int lane = threadIdx.x % WARP_SIZE, w = threadIdx.x / WARP_SIZE, par = lane & 1, pr = lane >> 1;
    const int gid = (int) ((blockIdx.x*blockDim.x + threadIdx.x) / 2);
    const int n = a.nblk + b.nblk;
    const int gid0 = gid - pr;
    if (gid0 >= n) {
        return;   // the whole warp is past the end
    }
    ggml_cuda_pdl_sync();   // under PDL: the rows come from the kernels before
    const bool in_a = gid < a.nblk, in_b = !in_a && gid < n;
    const float * src = nullptr, * off = nullptr;
    uint8_t * dst = nullptr;
    float * c0 = nullptr;
    block_q8_0 * rb = nullptr;
    if (in_a) {
        turbo_job_locate<idx_t>(a, gid, src, dst, off, c0, rb);
    } else if (in_b) {
        turbo_job_locate<idx_t>(b, gid - a.nblk, src, dst, off, c0, rb);
    }
    if (par == 0) {
        srcs[w][pr] = src;
    }
    if (lane < (1 << (bits_a - 1))) {
        c2s[w][lane] = turbo_t2_c2<bits_a>(lane);
    } else if (lane >= 4 && lane < 4 + (1 << (bits_b - 1))) {
        c2s[w][lane] = turbo_t2_c2<bits_b>(lane - 4);
    }
    __syncwarp();
    const int nb = min(TURBO_T2_PER_WARP, n - gid0);
    float * row = xs[w][pr];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= GGML_CUDA_CC_AMPERE
    const uint32_t dst0 = (uint32_t) __cvta_generic_to_shared(&xs[w][0][4*lane]);
    for (int k = 0; k < nb; ++k) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst0 + 4*k*TURBO_T2_ROW), "l"(srcs[w][k] + 4*lane));
    }
    asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group 0;" ::: "memory");
#else
    for (int k = 0; k < nb; ++k) {
        *(float4 *) &xs[w][k][4*lane] = *(const float4 *) (srcs[w][k] + 4*lane);
    }
#endif
    if (pr >= nb) {   // no block: zeros through the encode
#pragma unroll
        for (int i = par; i < QK_TURBO/4; i += 2) {
            ((float4 *) row)[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
    __syncwarp();
    // cell 0's exact blocks (ggml_set_rows_cell0; one per row of a stream's cell 0, rare): the whole warp rotates each
    // from its staged row, as the warp kernel does
    for (uint32_t want = __ballot_sync(0xffffffff, c0 != nullptr && par == 0); want != 0; want &= want - 1) {
        const int src_lane = __ffs(want) - 1;
        float * c0b = (float *) __shfl_sync(0xffffffff, (unsigned long long) c0, src_lane);
        const float * offb = (const float *) __shfl_sync(0xffffffff, (unsigned long long) off, src_lane);
        float v[4];
        turbo_warp_staged_values(xs[w][src_lane >> 1], offb, lane, v);
        turbo_warp_store_rotated<QK_TURBO>(c0b, v, lane);
    }
    // the ring's rows (ggml_set_rows_ring: every block of a job with a ring): likewise, a block at a time by the warp
    for (uint32_t want = __ballot_sync(0xffffffff, rb != nullptr && par == 0); want != 0; want &= want - 1) {
        const int src_lane = __ffs(want) - 1;
        block_q8_0 * rbb = (block_q8_0 *) __shfl_sync(0xffffffff, (unsigned long long) rb, src_lane);
        const float * offb = (const float *) __shfl_sync(0xffffffff, (unsigned long long) off, src_lane);
        float v[4];
        turbo_warp_staged_values(xs[w][src_lane >> 1], offb, lane, v);
        turbo_warp_store_ring<QK_TURBO>(rbb, v, lane);
    }
    // most warps hold blocks of one job; one may straddle the two, and then runs both encodes
    if (__any_sync(0xffffffff, in_a)) {
        turbo_t2_run<bits_a>(a, in_a, row, off, c2s[w], dst, par);
    }
    if (__any_sync(0xffffffff, in_b)) {
        turbo_t2_run<bits_b>(b, in_b, row, off, c2s[w] + 4, dst, par);
    }
}

// job a, then job b (b.nblk = 0 when there is one): a decode step's K and V writes in one launch (blocks of qk values)
template <typename src_t, typename idx_t, int bits_a, int bits_b, int qk>
static __global__ void k_turbo_set_rows(const turbo_set_rows_job a, const turbo_set_rows_job b) {
    const int wid = turbo_warp_index();
    const int lane = threadIdx.x % WARP_SIZE;
    ggml_cuda_pdl_sync();   // under PDL: the rows come from the kernels before
    ggml_cuda_pdl_lc();     // a decode step's few blocks: the attention may launch now (it waits for this write)
    if (wid < a.nblk) {
        turbo_set_rows_block<src_t, idx_t, bits_a, qk>(a, wid, lane);
    } else if (wid < a.nblk + b.nblk) {
        turbo_set_rows_block<src_t, idx_t, bits_b, qk>(b, wid - a.nblk, lane);
    }
}

template <typename src_t, typename idx_t>
static turbo_set_rows_job turbo_set_rows_job_of(const ggml_tensor * src0, const ggml_tensor * src1, ggml_tensor * dst,
        const float * off) {
    GGML_TENSOR_LOCALS(int64_t, ne0, src0, ne)
    GGML_TENSOR_LOCALS(size_t,  nb0, src0, nb)
    GGML_TENSOR_LOCALS(int64_t, ne1, src1, ne)
    GGML_TENSOR_LOCALS(size_t,  nb1, src1, nb)
    GGML_TENSOR_LOCALS(size_t,  nb,  dst,  nb)
    const int64_t qk = ggml_cuda_turbo_qk(dst->type);
    GGML_ASSERT(ne00 % qk == 0);
    GGML_ASSERT(nb00 == sizeof(src_t));
    const int64_t nbr  = ne00 / qk;
    const int64_t nblk = nbr*ne01*ne02*ne03;
    GGML_ASSERT(nblk < INT32_MAX && ne11 < INT32_MAX && ne12 < INT32_MAX);   // the kernel's 32-bit indexes
    turbo_set_rows_job j;
    j.src0 = src0->data; j.src1 = src1->data; j.dst = (char *) dst->data;
    j.nblk = (int) nblk; j.nbr = (int) nbr; j.ne01 = (int) ne01; j.ne02 = (int) ne02;
    j.ne11 = (int) ne11; j.ne12 = (int) ne12; j.bs = (int) ggml_type_size(dst->type);
    j.s01 = nb01/sizeof(src_t); j.s02 = nb02/sizeof(src_t); j.s03 = nb03/sizeof(src_t);
    j.s10 = nb10/sizeof(idx_t); j.s11 = nb11/sizeof(idx_t); j.s12 = nb12/sizeof(idx_t);
    j.nb1 = nb1; j.nb2 = nb2; j.nb3 = nb3;
    j.off = off;
    j.rope = turbo_rope{};
    j.fd_nbr  = init_fastdiv_values((uint64_t) nbr);
    j.fd_ne01 = init_fastdiv_values((uint64_t) ne01);
    j.fd_ne02 = init_fastdiv_values((uint64_t) ne02);
    j.fd_ne11 = init_fastdiv_values((uint64_t) ne11);
    j.fd_ne12 = init_fastdiv_values((uint64_t) ne12);
    const ggml_tensor * c0 = dst->src[3];   // ggml_set_rows_cell0
    j.c0 = nullptr;
    j.c0_ne0 = 0;
    j.fd_kv = make_uint3(0, 0, 0);
    if (c0) {
        GGML_ASSERT(c0->type == GGML_TYPE_F32 && ggml_is_contiguous(c0) && c0->ne[0] == dst->ne[0]);
        GGML_ASSERT(dst->ne[2] == 1 && dst->ne[3] == 1 && dst->ne[1] % c0->ne[1] == 0 && dst->ne[1] < INT32_MAX);
        j.c0 = (float *) c0->data;
        j.c0_ne0 = c0->ne[0];
        j.fd_kv = init_fastdiv_values((uint64_t) (dst->ne[1] / c0->ne[1]));
    }
    const ggml_tensor * ring = dst->src[4];   // ggml_set_rows_ring
    j.ring = nullptr;
    j.ring_nb1 = j.ring_nb2 = 0;
    j.fd_ring_kv = j.fd_ring_R = make_uint3(0, 0, 0);
    if (ring) {
        GGML_ASSERT(ggml_cuda_turbo_set_rows_ring_ok(dst));
        j.ring = (char *) ring->data;
        j.ring_nb1 = ring->nb[1];
        j.ring_nb2 = ring->nb[2];
        j.fd_ring_kv = init_fastdiv_values((uint64_t) (dst->ne[1] / ring->ne[2]));
        j.fd_ring_R  = init_fastdiv_values((uint64_t) ring->ne[1]);
    }
    return j;
}

const ggml_tensor * ggml_cuda_turbo_rope_params(const ggml_tensor * rope, const ggml_tensor * mul, turbo_rope & r) {
    GGML_ASSERT(!mul || rope->src[0] == mul);
    const int32_t * op = (const int32_t *) rope->op_params;
    float freq_base, beta_fast, beta_slow;
    memcpy(&freq_base,     op +  5, sizeof(float));
    memcpy(&r.freq_scale,  op +  6, sizeof(float));
    memcpy(&r.ext_factor,  op +  7, sizeof(float));
    memcpy(&r.attn_factor, op +  8, sizeof(float));
    memcpy(&beta_fast,     op +  9, sizeof(float));
    memcpy(&beta_slow,     op + 10, sizeof(float));
    r.n_dims = op[1];
    r.neox   = (op[2] & GGML_ROPE_TYPE_NEOX) != 0;
    r.n_offs = op[15];
    r.D      = (int) rope->src[0]->ne[0];
    r.theta_scale = powf(freq_base, -2.0f/r.n_dims);
    float corr[2];
    ggml_rope_yarn_corr_dims(r.n_dims, op[4], freq_base, beta_fast, beta_slow, corr);
    r.corr0 = corr[0]; r.corr1 = corr[1];
    r.pos = (const int32_t *) rope->src[1]->data;
    r.freq_factors = rope->src[2] ? (const float *) rope->src[2]->data : nullptr;
    r.mul = mul ? (const float *) mul->src[1]->data : nullptr;
    return mul ? mul->src[0] : rope->src[0];
}

// the job reads the ROPE's input instead of its (viewed) output, and rotates it as upstream's ROPE would; with mul
// (the MUL that makes the ROPE's input, ggml_cuda_turbo_rope_mul_fusable), the MUL's input, multiplied first
static void turbo_rope_of(const ggml_tensor * rope, turbo_set_rows_job & j, const ggml_tensor * mul = nullptr) {
    const ggml_tensor * x = ggml_cuda_turbo_rope_params(rope, mul, j.rope);
    j.src0 = x->data;
    j.s01  = x->nb[2]/sizeof(float);   // one token's heads are contiguous (checked by the caller)
}

// the bulk kernel (2 threads per block) reads float4s (f32 rows whose starts and strides are 16-byte multiples) and
// leaves a fused RoPE to the warp kernel
static bool turbo_bulk_aligned(const turbo_set_rows_job & j) {
    const auto a16 = [](const void * p) { return ((uintptr_t) p & 15) == 0; };
    return j.nblk == 0 || (a16(j.src0) && j.s01 % 4 == 0 && j.s02 % 4 == 0 && j.s03 % 4 == 0 && (!j.off || a16(j.off)) &&
        !j.rope.pos);
}

#define TURBO_BULK_MIN_BLOCKS 4096

template <typename src_t, typename idx_t, int bits_a, int qk>
static void turbo_set_rows_launch_b(cudaStream_t stream, const turbo_set_rows_job & a, const turbo_set_rows_job & b, const int bits_b) {
    // writes of at least TURBO_BULK_MIN_BLOCKS blocks (a prompt's ubatch): two threads per block, fewer instructions
    // per value (turbo-encode-t2.cuh). A decode step's few blocks keep the warp kernel, whose chain per
    // thread is the shortest, and so do rows the bulk kernel cannot read (f16, unaligned, a fused RoPE)
    const int64_t n = (int64_t) a.nblk + b.nblk;
    // the kernel for b's bit width (the same signature for both), on a grid of blocks_per CUDA blocks of `threads`
    const auto launch = [&](void (*k)(const turbo_set_rows_job, const turbo_set_rows_job), const int blocks_per, const int threads) {
        ggml_cuda_turbo_launch(k, dim3((unsigned) ((n + blocks_per - 1) / blocks_per)), dim3(threads), stream, a, b);
        CUDA_CHECK(cudaGetLastError());
    };
    // (turbo4 and the 64-value types have no 2-thread encoder: their writes take the warp kernel at any size)
    if constexpr (std::is_same_v<src_t, float> && bits_a != 4 && qk == QK_TURBO) {
        if (bits_b != 4 && n >= TURBO_BULK_MIN_BLOCKS && turbo_bulk_aligned(a) && turbo_bulk_aligned(b)) {
            launch(bits_b == 3 ? k_turbo_set_rows_t2<idx_t, bits_a, 3> : k_turbo_set_rows_t2<idx_t, bits_a, 2>,
                   TURBO_T2_WARPS*TURBO_T2_PER_WARP, TURBO_T2_WARPS*WARP_SIZE);
            return;
        }
    }
    launch(bits_b == 4 ? k_turbo_set_rows<src_t, idx_t, bits_a, 4, qk> :
           bits_b == 3 ? k_turbo_set_rows<src_t, idx_t, bits_a, 3, qk> : k_turbo_set_rows<src_t, idx_t, bits_a, 2, qk>,
           TURBO_WARPS_PER_BLOCK, TURBO_WARPS_PER_BLOCK*WARP_SIZE);
}

template <typename src_t, typename idx_t, int qk>
static void turbo_set_rows_launch_a(cudaStream_t stream, const turbo_set_rows_job & a, const turbo_set_rows_job & b,
        const int bits_a, const int bits_b) {
    if (bits_a == 4) {
        turbo_set_rows_launch_b<src_t, idx_t, 4, qk>(stream, a, b, bits_b);
    } else if (bits_a == 3) {
        turbo_set_rows_launch_b<src_t, idx_t, 3, qk>(stream, a, b, bits_b);
    } else {
        turbo_set_rows_launch_b<src_t, idx_t, 2, qk>(stream, a, b, bits_b);
    }
}

// writes a (and b, when given: same source and index types, same block size) with one launch; rope: a's values are
// rotated first
template <typename src_t, typename idx_t>
static void turbo_set_rows_launch(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1,
        ggml_tensor * dst, const float * off, const ggml_tensor * src0_b = nullptr, ggml_tensor * dst_b = nullptr,
        const ggml_tensor * rope = nullptr, const ggml_tensor * mul = nullptr) {
    turbo_set_rows_job a = turbo_set_rows_job_of<src_t, idx_t>(src0, src1, dst, off);
    if (rope) {
        turbo_rope_of(rope, a, mul);
    }
    turbo_set_rows_job b = a;
    b.nblk = 0;
    if (dst_b) {
        b = turbo_set_rows_job_of<src_t, idx_t>(src0_b, dst_b->src[1], dst_b, nullptr);
    }
    if ((int64_t) a.nblk + b.nblk == 0) {
        return;
    }
    const int bits_b = ggml_cuda_turbo_bits(dst_b ? dst_b->type : dst->type);
    GGML_ASSERT(!dst_b || ggml_cuda_turbo_qk(dst_b->type) == ggml_cuda_turbo_qk(dst->type));
    if (ggml_cuda_turbo_qk(dst->type) == QK_TURBO_64) {
        turbo_set_rows_launch_a<src_t, idx_t, QK_TURBO_64>(ctx.stream(), a, b, ggml_cuda_turbo_bits(dst->type), bits_b);
    } else {
        turbo_set_rows_launch_a<src_t, idx_t, QK_TURBO>(ctx.stream(), a, b, ggml_cuda_turbo_bits(dst->type), bits_b);
    }
}

static void turbo_set_rows_dispatch(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1,
        ggml_tensor * dst, const float * off) {
    ggml_cuda_turbo_check_tables();
    GGML_ASSERT(ggml_cuda_is_turbo_type(dst->type));
    GGML_ASSERT(src0->type == GGML_TYPE_F32 || src0->type == GGML_TYPE_F16);
    GGML_ASSERT(src1->type == GGML_TYPE_I64 || src1->type == GGML_TYPE_I32);
    GGML_ASSERT(off == nullptr || src0->type == GGML_TYPE_F32);
    if (src0->type == GGML_TYPE_F32) {
        if (src1->type == GGML_TYPE_I64) { turbo_set_rows_launch<float, int64_t>(ctx, src0, src1, dst, off); }
        else                             { turbo_set_rows_launch<float, int32_t>(ctx, src0, src1, dst, off); }
    } else {
        if (src1->type == GGML_TYPE_I64) { turbo_set_rows_launch<half, int64_t>(ctx, src0, src1, dst, off); }
        else                             { turbo_set_rows_launch<half, int32_t>(ctx, src0, src1, dst, off); }
    }
}

void ggml_cuda_turbo_set_rows(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    turbo_set_rows_dispatch(ctx, dst->src[0], dst->src[1], dst, nullptr);
}

bool ggml_cuda_turbo_set_rows_ring_ok(const ggml_tensor * dst) {
    const ggml_tensor * ring = dst->src[4];
    if (!ring) {
        return true;
    }
    const bool turbo = ggml_cuda_is_turbo_type(dst->type);
    return ring->type == (turbo ? GGML_TYPE_Q8_0 : dst->type) && ggml_is_contiguous(ring) && ring->ne[0] == dst->ne[0] &&
        ring->ne[1] > 0 && ring->ne[2] > 0 && ring->ne[3] == 1 && dst->ne[2] == 1 && dst->ne[3] == 1 &&
        dst->ne[1] % ring->ne[2] == 0 && dst->ne[1] < INT32_MAX && ring->ne[1] < INT32_MAX &&
        ggml_row_size(dst->type, dst->ne[0]) % 2 == 0 && dst->nb[1] % 2 == 0 && ring->nb[1] % 2 == 0;
}

// a non-turbo SET_ROWS's ring: the bytes of each row just stored at destination row s*kv_size + c copied to ring row
// c % R of stream s (a row of 16-bit words per CUDA block; every row size of ggml's types is even)
template <typename idx_t>
static __global__ void k_turbo_set_rows_ring_copy(const char * __restrict__ dst, const idx_t * __restrict__ idx,
        char * __restrict__ ring, const int64_t s10, const size_t nb1, const size_t ring_nb1, const size_t ring_nb2,
        const int row_words, const uint3 fd_kv, const uint3 fd_R) {
    const int64_t dst_row = (int64_t) idx[blockIdx.x*s10];
    const uint2 qr = fast_div_modulo((uint32_t) dst_row, fd_kv);   // (stream, cell)
    const uint16_t * src = (const uint16_t *) (dst + dst_row*nb1);
    uint16_t * out = (uint16_t *) (ring + qr.x*ring_nb2 + fastmodulo(qr.y, fd_R)*ring_nb1);
    for (int i = threadIdx.x; i < row_words; i += blockDim.x) {
        out[i] = src[i];
    }
}

void ggml_cuda_turbo_set_rows_ring(ggml_backend_cuda_context & ctx, const ggml_tensor * dst) {
    const ggml_tensor * ring = dst->src[4];
    if (!ring || ggml_cuda_is_turbo_type(dst->type)) {
        return;   // (a turbo write stores its ring rows itself)
    }
    GGML_ASSERT(ggml_cuda_turbo_set_rows_ring_ok(dst));
    const ggml_tensor * src1 = dst->src[1];
    const int64_t n = dst->src[0]->ne[1];   // (dst's ne[2] and ne[3] are 1, and so are the rows')
    if (n == 0) {
        return;
    }
    GGML_ASSERT(n < INT32_MAX && src1->ne[0] == n);
    const int row_words = (int) (ggml_row_size(dst->type, dst->ne[0]) / 2);
    const uint3 fd_kv = init_fastdiv_values((uint64_t) (dst->ne[1] / ring->ne[2]));
    const uint3 fd_R  = init_fastdiv_values((uint64_t) ring->ne[1]);
    const int threads = std::min(256, (row_words + 31) / 32 * 32);
    if (src1->type == GGML_TYPE_I64) {
        k_turbo_set_rows_ring_copy<int64_t><<<(unsigned) n, threads, 0, ctx.stream()>>>((const char *) dst->data,
            (const int64_t *) src1->data, (char *) ring->data, src1->nb[0]/sizeof(int64_t), dst->nb[1], ring->nb[1], ring->nb[2],
            row_words, fd_kv, fd_R);
    } else {
        GGML_ASSERT(src1->type == GGML_TYPE_I32);
        k_turbo_set_rows_ring_copy<int32_t><<<(unsigned) n, threads, 0, ctx.stream()>>>((const char *) dst->data,
            (const int32_t *) src1->data, (char *) ring->data, src1->nb[0]/sizeof(int32_t), dst->nb[1], ring->nb[1], ring->nb[2],
            row_words, fd_kv, fd_R);
    }
    CUDA_CHECK(cudaGetLastError());
}

// llama's turbo key offset (patch 0008: SUB of one f32 row, then SET_ROWS) as one kernel: the difference is
// taken as the values are loaded. A decode step writes one K row per layer, so the launch saved is most of
// the cost. The caller (ggml-cuda.cu's fusion) checks that only the SET_ROWS reads the difference.
bool ggml_cuda_turbo_set_rows_sub_fusable(const ggml_tensor * sub, const ggml_tensor * set_rows) {
    if (sub->op != GGML_OP_SUB || set_rows->op != GGML_OP_SET_ROWS || set_rows->src[0] != sub) {
        return false;
    }
    const ggml_tensor * a   = sub->src[0];
    const ggml_tensor * off = sub->src[1];
    if (!ggml_cuda_is_turbo_type(set_rows->type)) {
        return false;
    }
    const int64_t qk = ggml_cuda_turbo_qk(set_rows->type);
    // K's RoPE before it (ROPE -> VIEW), which the fused write may do on load (ggml_cuda_turbo_rope_set_rows_fusable):
    // only when each block lies in one head, and a neox pair (m, m + D/2) in one block (else neither fusion)
    if (a->op == GGML_OP_VIEW && a->src[0]->op == GGML_OP_ROPE) {
        const int64_t D = a->src[0]->src[0]->ne[0];
        const int mode = ((const int32_t *) a->src[0]->op_params)[2];
        if (D % qk != 0 || (mode == GGML_ROPE_TYPE_NEOX && D != qk)) {
            return false;
        }
    }
    return sub->type == GGML_TYPE_F32 && a->type == GGML_TYPE_F32 &&
        off->type == GGML_TYPE_F32 && ggml_are_same_shape(a, sub) && a->nb[0] == sizeof(float) &&
        ggml_is_contiguous(off) && off->ne[0] == a->ne[0] && ggml_nelements(off) == off->ne[0] &&
        a->ne[0] % qk == 0 && (set_rows->src[1]->type == GGML_TYPE_I64 || set_rows->src[1]->type == GGML_TYPE_I32);
}

void ggml_cuda_turbo_set_rows_sub(ggml_backend_cuda_context & ctx, const ggml_tensor * sub, ggml_tensor * set_rows) {
    turbo_set_rows_dispatch(ctx, sub->src[0], set_rows->src[1], set_rows, (const float *) sub->src[1]->data);
}

// the V write that llama issues right after the K write (only views between them): it joins the fused K write
// when it is a SET_ROWS of f32 rows into a turbo tensor of the same block size with the same index type, so that a
// decode step's two cache writes are one launch instead of two (each is a few microseconds of latency for one row per
// layer)
bool ggml_cuda_turbo_set_rows_pair_fusable(const ggml_tensor * set_rows_k, const ggml_tensor * set_rows_v) {
    if (set_rows_v->op != GGML_OP_SET_ROWS || !ggml_cuda_is_turbo_type(set_rows_v->type) ||
        ggml_cuda_turbo_qk(set_rows_v->type) != ggml_cuda_turbo_qk(set_rows_k->type)) {
        return false;
    }
    const ggml_tensor * x = set_rows_v->src[0];
    const ggml_tensor * idx = set_rows_v->src[1];
    return x->type == GGML_TYPE_F32 && x->nb[0] == sizeof(float) && x->ne[0] % ggml_cuda_turbo_qk(set_rows_v->type) == 0 &&
        idx->type == set_rows_k->src[1]->type && set_rows_v->data != set_rows_k->data &&
        x != set_rows_k && x->view_src != set_rows_k;
}

void ggml_cuda_turbo_set_rows_sub_pair(ggml_backend_cuda_context & ctx, const ggml_tensor * sub, ggml_tensor * set_rows_k,
        ggml_tensor * set_rows_v, const ggml_tensor * rope, const ggml_tensor * mul) {
    ggml_cuda_turbo_check_tables();
    GGML_ASSERT(!mul || rope);
    // said once, so that a log shows the fusion happened (it never runs on Gemma 3, whose graph puts V's
    // matmul between K's ROPE and the SUB, and nothing had shown that)
    static bool said = false;
    if (rope && !said) {
        said = true;
        GGML_LOG_INFO("turbo: K's RoPE done by the turbo K write (%s, %d-wide heads)\n", rope->name, (int) rope->ne[0]);
    }
    static bool said_mul = false;
    if (mul && !said_mul) {
        said_mul = true;
        GGML_LOG_INFO("turbo: the MUL before K's RoPE done by the turbo K write too (%s)\n", mul->name);
    }
    const float * off = (const float *) sub->src[1]->data;
    const ggml_tensor * src_v = set_rows_v ? set_rows_v->src[0] : nullptr;
    if (set_rows_k->src[1]->type == GGML_TYPE_I64) {
        turbo_set_rows_launch<float, int64_t>(ctx, sub->src[0], set_rows_k->src[1], set_rows_k, off, src_v, set_rows_v, rope, mul);
    } else {
        turbo_set_rows_launch<float, int32_t>(ctx, sub->src[0], set_rows_k->src[1], set_rows_k, off, src_v, set_rows_v, rope, mul);
    }
}

// llama's RoPE of K (ROPE -> VIEW -> the offset's SUB) joins the fused K write: the kernel rotates the values as it
// loads them, the RoPEs of ggml_cuda_turbo_rope_on_load_ok; the rope's input with each token's heads contiguous,
// one position per token, no ne[3].
bool ggml_cuda_turbo_rope_set_rows_fusable(const ggml_tensor * rope, const ggml_tensor * view, const ggml_tensor * sub) {
    if (rope->op != GGML_OP_ROPE || view->op != GGML_OP_VIEW || view->src[0] != rope || sub->src[0] != view) {
        return false;
    }
    const ggml_tensor * x = rope->src[0];
    const int64_t D = x->ne[0];
    const bool shape_ok = x->nb[0] == sizeof(float) && x->nb[1] == D*sizeof(float) && ggml_is_contiguous(view) &&
        view->ne[0] == x->ne[0]*x->ne[1] && view->ne[1] == x->ne[2];
    return shape_ok && ggml_cuda_turbo_rope_on_load_ok(rope);
}

// llama's q*D and k/D (patch 0041: Llama and Qwen2 with a turbo K cache) sit between the projections and the RoPEs:
// two launches more per layer and token unless fused. A MUL that the fused RoPE kernels absorb: f32 x times a
// contiguous f32 row d of x's width (one head),
// broadcast over heads and tokens, x with the MUL's layout (so the kernels read it in place of the MUL's output),
// the MUL's one consumer the ROPE after it with only views between (nothing computed between can overwrite x). The
// fused ROPE's own checks (ggml_cuda_turbo_rope_fa_fusable, ggml_cuda_turbo_rope_set_rows_fusable) decide the rest.
int ggml_cuda_turbo_rope_mul_fusable(const ggml_cgraph * cgraph, const int i) {
    const ggml_tensor * mul = cgraph->nodes[i];
    if (mul->op != GGML_OP_MUL || ggml_node_get_use_count(cgraph, i) != 1 || (mul->flags & GGML_TENSOR_FLAG_OUTPUT)) {
        return 0;
    }
    const ggml_tensor * x = mul->src[0];
    const ggml_tensor * d = mul->src[1];
    if (mul->type != GGML_TYPE_F32 || x->type != GGML_TYPE_F32 || d->type != GGML_TYPE_F32 ||
        !ggml_are_same_layout(x, mul) || !ggml_is_contiguous(d) || d->ne[0] != mul->ne[0] ||
        ggml_nelements(d) != d->ne[0]) {
        return 0;
    }
    for (int j = i + 1; j < cgraph->n_nodes && j <= i + 4; ++j) {
        const ggml_tensor * n = cgraph->nodes[j];
        if (n->op == GGML_OP_ROPE) {
            return n->src[0] == mul ? j - i : 0;
        }
        if (!ggml_op_is_empty(n->op)) {
            return 0;
        }
    }
    return 0;
}

// what turbo_rope_block can do (K's RoPE in the write, Q's in the attention): f32 in and out, one position per token,
// no ne[3]; normal RoPE of any even width, neox for heads rotated whole as wide as a block (128, or 64 for the
// 64-value types: a neox pair is then in one lane; ggml_cuda_turbo_set_rows_sub_fusable checks the block size).
// (256-wide neox heads, whose pairs span the head's two blocks, are left to upstream's ROPE: Gemma 3, the model with
// them, matches neither fusion's pattern)
bool ggml_cuda_turbo_rope_on_load_ok(const ggml_tensor * rope) {
    const ggml_tensor * x = rope->src[0];
    const int32_t * op = (const int32_t *) rope->op_params;
    const int n_dims = op[1], mode = op[2], n_offs = op[15];
    const int64_t D = x->ne[0];
    const bool types_ok = rope->type == GGML_TYPE_F32 && x->type == GGML_TYPE_F32 && rope->src[1]->type == GGML_TYPE_I32 &&
        rope->src[1]->ne[0] == x->ne[2] && x->ne[3] == 1;
    const bool mode_ok = (mode == GGML_ROPE_TYPE_NORMAL && n_dims % 2 == 0 && n_offs % 2 == 0 && n_offs + n_dims <= D) ||
        (mode == GGML_ROPE_TYPE_NEOX && (D == QK_TURBO || D == QK_TURBO_64) && n_dims == D && n_offs == 0);
    return types_ok && mode_ok;
}

// ---- CPY ------------------------------------------------------------------------------------------

// f32/f16 -> turbo: qk consecutive elements in logical order are one block of the destination (ne00 is a multiple of
// qk, so they lie in one row of src0: element lane + 32k of the block at (lane + 32k)*nb00 from the first)
template <typename src_t, int bits, int qk>
static __global__ void k_turbo_cpy_to(
        const char * __restrict__ src0, char * __restrict__ dst, const int64_t nblk,
        const int64_t ne00, const int64_t ne01, const int64_t ne02,
        const size_t nb00, const size_t nb01, const size_t nb02, const size_t nb03,
        const int64_t ne10, const int64_t ne11, const int64_t ne12,
        const size_t nb11, const size_t nb12, const size_t nb13, const int bs) {
    constexpr int nv = qk/WARP_SIZE;
    const int64_t wid = ((int64_t) blockIdx.x*blockDim.x + threadIdx.x) / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (wid >= nblk) {
        return;
    }
    const int64_t e = wid*qk;
    int64_t r = e;
    const int64_t i00 = r % ne00; r /= ne00;
    const int64_t i01 = r % ne01; r /= ne01;
    const int64_t i02 = r % ne02;
    const int64_t i03 = r / ne02;
    r = e;
    const int64_t i10 = r % ne10; r /= ne10;
    const int64_t i11 = r % ne11; r /= ne11;
    const int64_t i12 = r % ne12;
    const int64_t i13 = r / ne12;

    const char * x = src0 + i03*nb03 + i02*nb02 + i01*nb01 + i00*nb00;
    float v[nv];
#pragma unroll
    for (int k = 0; k < nv; ++k) {
        v[k] = turbo_to_f32(*(const src_t *) (x + (lane + 32*k)*nb00));
    }
    int codes[nv];
    const uint16_t h = turbo_warp_encode_qk<bits, qk>(v, codes, lane);
    turbo_warp_store_qk<bits, qk>((uint8_t *) (dst + i13*nb13 + i12*nb12 + i11*nb11 + (i10/qk)*bs), h, codes, lane);
}

// turbo -> f32/f16
template <typename dst_t, int bits, int qk>
static __global__ void k_turbo_cpy_from(
        const char * __restrict__ src0, char * __restrict__ dst, const int64_t nblk,
        const int64_t ne00, const int64_t ne01, const int64_t ne02,
        const size_t nb01, const size_t nb02, const size_t nb03,
        const int64_t ne10, const int64_t ne11, const int64_t ne12,
        const size_t nb10, const size_t nb11, const size_t nb12, const size_t nb13, const int bs) {
    constexpr int nv = qk/WARP_SIZE;
    const int64_t wid = ((int64_t) blockIdx.x*blockDim.x + threadIdx.x) / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (wid >= nblk) {
        return;
    }
    const int64_t e = wid*qk;
    int64_t r = e;
    const int64_t i00 = r % ne00; r /= ne00;
    const int64_t i01 = r % ne01; r /= ne01;
    const int64_t i02 = r % ne02;
    const int64_t i03 = r / ne02;
    float v[nv];
    turbo_warp_decode_qk<bits, qk>((const uint8_t *) (src0 + i03*nb03 + i02*nb02 + i01*nb01 + (i00/qk)*bs), v, lane);
#pragma unroll
    for (int k = 0; k < nv; ++k) {
        int64_t q = e + lane + 32*k;
        const int64_t i10 = q % ne10; q /= ne10;
        const int64_t i11 = q % ne11; q /= ne11;
        const int64_t i12 = q % ne12;
        const int64_t i13 = q / ne12;
        *(dst_t *) (dst + i13*nb13 + i12*nb12 + i11*nb11 + i10*nb10) = turbo_from_f32<dst_t>(v[k]);
    }
}

bool ggml_cuda_turbo_cpy_supported(const ggml_tensor * src0, const ggml_tensor * src1) {
    const int qk_to = ggml_cuda_turbo_qk(src1->type), qk_from = ggml_cuda_turbo_qk(src0->type);
    const bool to   = qk_to   && (src0->type == GGML_TYPE_F32 || src0->type == GGML_TYPE_F16);
    const bool from = qk_from && (src1->type == GGML_TYPE_F32 || src1->type == GGML_TYPE_F16);
    if (!to && !from) {
        return false;
    }
    const ggml_tensor * q = to ? src1 : src0;
    const int qk = to ? qk_to : qk_from;
    // the 64-value types also ask for whole blocks in the quantized side's rows (it is addressed block by block)
    return src0->ne[0] % qk == 0 && src1->ne[0] % qk == 0 && (qk == QK_TURBO || q->nb[0] == ggml_type_size(q->type));
}

template <int qk>
static void turbo_cpy_qk(cudaStream_t stream, const ggml_tensor * src0, ggml_tensor * src1, const int64_t nblk) {
    const dim3 grid = turbo_grid(nblk);
    const dim3 block(TURBO_WARPS_PER_BLOCK*WARP_SIZE);
    const char * s = (const char *) src0->data;
    char * d = (char *) src1->data;
#define TURBO_CPY_TO_ARGS  s, d, nblk, src0->ne[0], src0->ne[1], src0->ne[2], src0->nb[0], src0->nb[1], src0->nb[2], src0->nb[3], \
        src1->ne[0], src1->ne[1], src1->ne[2], src1->nb[1], src1->nb[2], src1->nb[3], (int) ggml_type_size(src1->type)
#define TURBO_CPY_FROM_ARGS s, d, nblk, src0->ne[0], src0->ne[1], src0->ne[2], src0->nb[1], src0->nb[2], src0->nb[3], \
        src1->ne[0], src1->ne[1], src1->ne[2], src1->nb[0], src1->nb[1], src1->nb[2], src1->nb[3], (int) ggml_type_size(src0->type)
    if (ggml_cuda_turbo_qk(src1->type) == qk) {
        const int bits = ggml_cuda_turbo_bits(src1->type);
        if (src0->type == GGML_TYPE_F32) {
            if (bits == 4)      k_turbo_cpy_to<float, 4, qk><<<grid, block, 0, stream>>>(TURBO_CPY_TO_ARGS);
            else if (bits == 3) k_turbo_cpy_to<float, 3, qk><<<grid, block, 0, stream>>>(TURBO_CPY_TO_ARGS);
            else                k_turbo_cpy_to<float, 2, qk><<<grid, block, 0, stream>>>(TURBO_CPY_TO_ARGS);
        } else {
            if (bits == 4)      k_turbo_cpy_to<half, 4, qk><<<grid, block, 0, stream>>>(TURBO_CPY_TO_ARGS);
            else if (bits == 3) k_turbo_cpy_to<half, 3, qk><<<grid, block, 0, stream>>>(TURBO_CPY_TO_ARGS);
            else                k_turbo_cpy_to<half, 2, qk><<<grid, block, 0, stream>>>(TURBO_CPY_TO_ARGS);
        }
    } else {
        const int bits = ggml_cuda_turbo_bits(src0->type);
        if (src1->type == GGML_TYPE_F32) {
            if (bits == 4)      k_turbo_cpy_from<float, 4, qk><<<grid, block, 0, stream>>>(TURBO_CPY_FROM_ARGS);
            else if (bits == 3) k_turbo_cpy_from<float, 3, qk><<<grid, block, 0, stream>>>(TURBO_CPY_FROM_ARGS);
            else                k_turbo_cpy_from<float, 2, qk><<<grid, block, 0, stream>>>(TURBO_CPY_FROM_ARGS);
        } else {
            if (bits == 4)      k_turbo_cpy_from<half, 4, qk><<<grid, block, 0, stream>>>(TURBO_CPY_FROM_ARGS);
            else if (bits == 3) k_turbo_cpy_from<half, 3, qk><<<grid, block, 0, stream>>>(TURBO_CPY_FROM_ARGS);
            else                k_turbo_cpy_from<half, 2, qk><<<grid, block, 0, stream>>>(TURBO_CPY_FROM_ARGS);
        }
    }
#undef TURBO_CPY_TO_ARGS
#undef TURBO_CPY_FROM_ARGS
}

void ggml_cuda_turbo_cpy(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, ggml_tensor * src1) {
    ggml_cuda_turbo_check_tables();
    GGML_ASSERT(ggml_cuda_turbo_cpy_supported(src0, src1));
    GGML_ASSERT(ggml_nelements(src0) == ggml_nelements(src1));
    const int qk = ggml_cuda_turbo_qk(src1->type) ? ggml_cuda_turbo_qk(src1->type) : ggml_cuda_turbo_qk(src0->type);
    const int64_t nblk = ggml_nelements(src0) / qk;
    if (nblk == 0) {
        return;
    }
    if (qk == QK_TURBO_64) {
        turbo_cpy_qk<QK_TURBO_64>(ctx.stream(), src0, src1, nblk);
    } else {
        turbo_cpy_qk<QK_TURBO>(ctx.stream(), src0, src1, nblk);
    }
    CUDA_CHECK(cudaGetLastError());
}

// ---- GET_ROWS -------------------------------------------------------------------------------------

template <typename dst_t, int bits, int qk>
static __global__ void k_turbo_get_rows(
        const char * __restrict__ src0, const int32_t * __restrict__ src1, char * __restrict__ dst, const int64_t nblk,
        const int64_t nbr, const int64_t ne10, const int64_t ne11,
        const size_t nb01, const size_t nb02, const size_t nb03,
        const int64_t s10, const int64_t s11, const int64_t s12,
        const size_t nb1, const size_t nb2, const size_t nb3, const int bs) {
    constexpr int nv = qk/WARP_SIZE;
    const int64_t wid = ((int64_t) blockIdx.x*blockDim.x + threadIdx.x) / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (wid >= nblk) {
        return;
    }
    int64_t r = wid / nbr;
    const int64_t ib  = wid - r*nbr;
    const int64_t i10 = r % ne10; r /= ne10;
    const int64_t i11 = r % ne11;
    const int64_t i12 = r / ne11;
    const int64_t row = src1[i10*s10 + i11*s11 + i12*s12];
    float v[nv];
    turbo_warp_decode_qk<bits, qk>((const uint8_t *) (src0 + row*nb01 + i11*nb02 + i12*nb03 + ib*bs), v, lane);
    dst_t * y = (dst_t *) (dst + i10*nb1 + i11*nb2 + i12*nb3) + ib*qk;
#pragma unroll
    for (int k = 0; k < nv; ++k) {
        y[lane + 32*k] = turbo_from_f32<dst_t>(v[k]);
    }
}

template <int qk>
static void turbo_get_rows_qk(cudaStream_t stream, ggml_tensor * dst) {
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];
    GGML_TENSOR_BINARY_OP_LOCALS
    GGML_ASSERT(src1->type == GGML_TYPE_I32);
    GGML_ASSERT(dst->type == GGML_TYPE_F32 || dst->type == GGML_TYPE_F16);
    GGML_ASSERT(ne00 % qk == 0);
    const int64_t nbr  = ne00 / qk;
    const int64_t nblk = nbr*ne10*ne11*ne12;
    if (nblk == 0) {
        return;
    }
    const dim3 grid = turbo_grid(nblk);
    const dim3 block(TURBO_WARPS_PER_BLOCK*WARP_SIZE);
    const int bs = (int) ggml_type_size(src0->type);
    const int bits = ggml_cuda_turbo_bits(src0->type);
#define TURBO_GR_ARGS (const char *) src0->data, (const int32_t *) src1->data, (char *) dst->data, nblk, nbr, ne10, ne11, \
        nb01, nb02, nb03, (int64_t) (nb10/4), (int64_t) (nb11/4), (int64_t) (nb12/4), nb1, nb2, nb3, bs
    if (dst->type == GGML_TYPE_F32) {
        if (bits == 4)      k_turbo_get_rows<float, 4, qk><<<grid, block, 0, stream>>>(TURBO_GR_ARGS);
        else if (bits == 3) k_turbo_get_rows<float, 3, qk><<<grid, block, 0, stream>>>(TURBO_GR_ARGS);
        else                k_turbo_get_rows<float, 2, qk><<<grid, block, 0, stream>>>(TURBO_GR_ARGS);
    } else {
        if (bits == 4)      k_turbo_get_rows<half, 4, qk><<<grid, block, 0, stream>>>(TURBO_GR_ARGS);
        else if (bits == 3) k_turbo_get_rows<half, 3, qk><<<grid, block, 0, stream>>>(TURBO_GR_ARGS);
        else                k_turbo_get_rows<half, 2, qk><<<grid, block, 0, stream>>>(TURBO_GR_ARGS);
    }
#undef TURBO_GR_ARGS
    CUDA_CHECK(cudaGetLastError());
}

void ggml_cuda_turbo_get_rows(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    ggml_cuda_turbo_check_tables();
    if (ggml_cuda_turbo_qk(dst->src[0]->type) == QK_TURBO_64) {
        turbo_get_rows_qk<QK_TURBO_64>(ctx.stream(), dst);
    } else {
        turbo_get_rows_qk<QK_TURBO>(ctx.stream(), dst);
    }
}

// ---- to_fp16 / to_fp32 (contiguous and non-contiguous) --------------------------------------------

template <typename dst_t, int bits, int qk>
static __global__ void k_turbo_dequant(const char * __restrict__ x, dst_t * __restrict__ y, const int nblk,
        const int nbr, const int ne01, const int ne02, const int64_t s01, const int64_t s02, const int64_t s03, const int bs) {
    constexpr int nv = qk/WARP_SIZE;
    const int wid = turbo_warp_index();
    const int lane = threadIdx.x % WARP_SIZE;
    if (wid >= nblk) {
        return;
    }
    const turbo_block_pos b = turbo_block_at(wid, nbr, ne01, ne02);
    float v[nv];
    turbo_warp_decode_qk<bits, qk>((const uint8_t *) (x + (b.i1*s01 + b.i2*s02 + b.i3*s03 + b.ib)*bs), v, lane);
    dst_t * yb = y + (int64_t) wid*qk;
#pragma unroll
    for (int k = 0; k < nv; ++k) {
        yb[lane + 32*k] = turbo_from_f32<dst_t>(v[k]);
    }
}

template <typename dst_t, ggml_type type>
static void turbo_dequant_nc_cuda(const void * x, dst_t * y, int64_t ne00, int64_t ne01, int64_t ne02, int64_t ne03,
        int64_t s01, int64_t s02, int64_t s03, cudaStream_t stream) {
    constexpr int qk = turbo_traits<type>::qk;
    GGML_ASSERT(ne00 % qk == 0);
    const int64_t nbr  = ne00 / qk;
    const int64_t nblk = nbr*ne01*ne02*ne03;
    if (nblk == 0) {
        return;
    }
    GGML_ASSERT(nblk < INT32_MAX);   // the kernel's 32-bit indexes
    k_turbo_dequant<dst_t, turbo_traits<type>::bits, qk><<<turbo_grid(nblk), TURBO_WARPS_PER_BLOCK*WARP_SIZE, 0, stream>>>(
        (const char *) x, y, nblk, nbr, ne01, ne02, s01, s02, s03, turbo_traits<type>::bs);
}

template <typename dst_t, ggml_type type>
static void turbo_dequant_cuda(const void * x, dst_t * y, int64_t k, cudaStream_t stream) {
    constexpr int qk = turbo_traits<type>::qk;
    GGML_ASSERT(k % qk == 0);
    const int64_t nb = k / qk;
    // one row of nb blocks: s01 unused
    turbo_dequant_nc_cuda<dst_t, type>(x, y, k, 1, 1, 1, nb, nb, nb, stream);
}

// the conversion of each turbo type, f(dst_t, type) one of the two templates above
#define TURBO_CONVERSION(f, dst_t) \
    switch (type) { \
        case GGML_TYPE_TURBO4:    return f<dst_t, GGML_TYPE_TURBO4>; \
        case GGML_TYPE_TURBO3:    return f<dst_t, GGML_TYPE_TURBO3>; \
        case GGML_TYPE_TURBO2:    return f<dst_t, GGML_TYPE_TURBO2>; \
        case GGML_TYPE_TURBO4_64: return f<dst_t, GGML_TYPE_TURBO4_64>; \
        case GGML_TYPE_TURBO3_64: return f<dst_t, GGML_TYPE_TURBO3_64>; \
        case GGML_TYPE_TURBO2_64: return f<dst_t, GGML_TYPE_TURBO2_64>; \
        default: return nullptr; \
    }
to_fp16_cuda_t ggml_cuda_turbo_get_to_fp16(ggml_type type) {
    TURBO_CONVERSION(turbo_dequant_cuda, half)
}
to_fp32_cuda_t ggml_cuda_turbo_get_to_fp32(ggml_type type) {
    TURBO_CONVERSION(turbo_dequant_cuda, float)
}
to_fp16_nc_cuda_t ggml_cuda_turbo_get_to_fp16_nc(ggml_type type) {
    TURBO_CONVERSION(turbo_dequant_nc_cuda, half)
}
to_fp32_nc_cuda_t ggml_cuda_turbo_get_to_fp32_nc(ggml_type type) {
    TURBO_CONVERSION(turbo_dequant_nc_cuda, float)
}
#undef TURBO_CONVERSION

// ---- supports_op ----------------------------------------------------------------------------------

int ggml_cuda_turbo_supports_op(const ggml_tensor * op) {
    switch (op->op) {
        case GGML_OP_GET_ROWS:
            if (!ggml_cuda_is_turbo_type(op->src[0]->type)) {
                return -1;
            }
            return op->src[0]->ne[0] % ggml_blck_size(op->src[0]->type) == 0 &&
                   (op->type == GGML_TYPE_F32 || op->type == GGML_TYPE_F16);
        case GGML_OP_SET_ROWS:
            if (!ggml_cuda_is_turbo_type(op->type)) {
                return ggml_cuda_turbo_set_rows_ring_ok(op) ? -1 : 0;   // (a ring: ggml_cuda_turbo_set_rows_ring copies)
            }
            return (op->src[0]->type == GGML_TYPE_F32 || op->src[0]->type == GGML_TYPE_F16) &&
                   op->src[0]->ne[0] % ggml_blck_size(op->type) == 0 &&
                   (op->src[1]->type == GGML_TYPE_I64 || op->src[1]->type == GGML_TYPE_I32) &&
                   ggml_cuda_turbo_set_rows_ring_ok(op);
        case GGML_OP_CPY:
            if (op->src[0]->type == op->src[1]->type ||
                (!ggml_cuda_is_turbo_type(op->src[0]->type) && !ggml_cuda_is_turbo_type(op->src[1]->type))) {
                return -1;   // a same-type copy is upstream's (a memcpy)
            }
            return ggml_cuda_turbo_cpy_supported(op->src[0], op->src[1]);
        case GGML_OP_FLASH_ATTN_EXT:
            // a ring (ggml_flash_attn_ext_set_ring) is the turbo kernels' only: refused where neither side is turbo
            if (op->src[7] && !ggml_cuda_is_turbo_type(op->src[1]->type) && !ggml_cuda_is_turbo_type(op->src[2]->type)) {
                return 0;
            }
            return -1;   // fattn.cu's ggml_cuda_flash_attn_ext_supported asks fattn-turbo.cu
        default:
            break;
    }
    // the 64-value types (head_dim 64 models) have CUDA kernels for the cache's ops above and views of them; any other
    // op that reads or writes one stays on the CPU backend
    if (ggml_op_is_empty(op->op)) {
        return -1;
    }
    for (int i = -1; i < GGML_MAX_SRC; i++) {
        const ggml_tensor * t = i < 0 ? op : op->src[i];
        if (t && ggml_cuda_turbo_qk(t->type) == QK_TURBO_64) {
            static bool said = false;   // said once: the op then runs on the CPU backend
            if (!said) {
                said = true;
                GGML_LOG_WARN("ggml-cuda: %s of the 64-value turbo types (head_dim 64) has no CUDA kernel; it runs on "
                              "the CPU\n", ggml_op_name(op->op));
            }
            return 0;
        }
    }
    return -1;
}
