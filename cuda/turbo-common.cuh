// turbo-llama: CUDA side of the turbo4/turbo3/turbo2 KV-cache formats (see cpu_ref/ggml-turbo.h).
//
// The format's single source of truth is cpu_ref/ (copied to ggml/src/ by the overlay). The device
// tables below repeat its constants as literals (device code cannot read the host arrays of
// turbo-codebooks.h); ggml_cuda_turbo_check_tables() compares them with the host arrays at the first
// use and aborts on any difference, so they cannot drift apart silently.
//
// Layout of the per-block helpers: one warp handles one 128-value block, lane l holds the values
// i = l + 32*k, k = 0..3. Every float operation of the encoder is the one of the C reference, in the
// same order, with explicitly rounded intrinsics (ggml-cuda is compiled with -use_fast_math).
#pragma once

#include "common.cuh"
#include "ggml-turbo.h"
#include "turbo.cuh"

#define TURBO_CUDA_INV_SQRT_QK 0.0883883476483184405f
#define TURBO_CUDA_FP16_MAX    65504.0f
#define TURBO_CUDA_BIG_AMAX    4294967296.0f

static __device__ __constant__ unsigned int turbo_d_sign_words[4] = {
    0x45A7BC9Fu, 0x045B6659u, 0x160D132Eu, 0x3F917713u
};

// host copies, compared with turbo-codebooks.h at runtime (turbo.cu)
#define TURBO_CUDA_SIGN_WORDS { 0x45A7BC9Fu, 0x045B6659u, 0x160D132Eu, 0x3F917713u }
#define TURBO_CUDA_C3 { -1.883954848e-01f, -1.181377328e-01f, -6.658387765e-02f, -2.160362474e-02f, \
                         2.160362474e-02f,  6.658387765e-02f,  1.181377328e-01f,  1.883954848e-01f }
#define TURBO_CUDA_B3 { -1.532666088e-01f, -9.236080523e-02f, -4.409375120e-02f, 0.000000000e+00f, \
                         4.409375120e-02f,  9.236080523e-02f,  1.532666088e-01f }
#define TURBO_CUDA_C2 { -1.330422666e-01f, -3.999196213e-02f, 3.999196213e-02f, 1.330422666e-01f }
#define TURBO_CUDA_B2 { -8.651711434e-02f, 0.000000000e+00f, 8.651711434e-02f }
#define TURBO_CUDA_C4 { -2.376536064e-01f, -1.808237238e-01f, -1.417921709e-01f, -1.102754179e-01f, \
                        -8.281619917e-02f, -5.776178037e-02f, -3.414419324e-02f, -1.129977427e-02f, \
                         1.129977427e-02f,  3.414419324e-02f,  5.776178037e-02f,  8.281619917e-02f, \
                         1.102754179e-01f,  1.417921709e-01f,  1.808237238e-01f,  2.376536064e-01f }
#define TURBO_CUDA_B4 { -2.092386651e-01f, -1.613079474e-01f, -1.260337944e-01f, -9.654580853e-02f, \
                        -7.028898977e-02f, -4.595298680e-02f, -2.272198376e-02f,  0.000000000e+00f, \
                         2.272198376e-02f,  4.595298680e-02f,  7.028898977e-02f,  9.654580853e-02f, \
                         1.260337944e-01f,  1.613079474e-01f,  2.092386651e-01f }

static __device__ __constant__ float turbo_d_c3[8] = TURBO_CUDA_C3;
static __device__ __constant__ float turbo_d_b3[7] = TURBO_CUDA_B3;
static __device__ __constant__ float turbo_d_c2[4] = TURBO_CUDA_C2;
static __device__ __constant__ float turbo_d_b2[3] = TURBO_CUDA_B2;
static __device__ __constant__ float turbo_d_c4[16] = TURBO_CUDA_C4;
static __device__ __constant__ float turbo_d_b4[15] = TURBO_CUDA_B4;

#define TURBO64_INV_SQRT 0.125f   // 1/sqrt(64), exact
// the 64-value blocks' d = 64 codebooks (turbo-codebooks-64.h) as device literals, compared with the host arrays at
// first use (turbo.cu)
#define TURBO64_CUDA_C3 { -2.639118904e-01f, -1.661654508e-01f, -9.383050444e-02f, -3.046860396e-02f, \
                           3.046860396e-02f,  9.383050444e-02f,  1.661654508e-01f,  2.639118904e-01f }
#define TURBO64_CUDA_B3 { -2.150386706e-01f, -1.299979776e-01f, -6.214955420e-02f, 0.000000000e+00f, \
                           6.214955420e-02f,  1.299979776e-01f,  2.150386706e-01f }
#define TURBO64_CUDA_C2 { -1.874973527e-01f, -5.651511998e-02f, 5.651511998e-02f, 1.874973527e-01f }
#define TURBO64_CUDA_B2 { -1.220062364e-01f, 0.000000000e+00f, 1.220062364e-01f }
#define TURBO64_CUDA_C4 { -3.307860921e-01f, -2.529018923e-01f, -1.988439333e-01f, -1.549136965e-01f, \
                          -1.164762114e-01f, -8.130337259e-02f, -4.808427844e-02f, -1.591710151e-02f, \
                           1.591710151e-02f,  4.808427844e-02f,  8.130337259e-02f,  1.164762114e-01f, \
                           1.549136965e-01f,  1.988439333e-01f,  2.529018923e-01f,  3.307860921e-01f }
#define TURBO64_CUDA_B4 { -2.918439922e-01f, -2.258729128e-01f, -1.768788149e-01f, -1.356949539e-01f, \
                          -9.888979200e-02f, -6.469382552e-02f, -3.200068997e-02f,  0.000000000e+00f, \
                           3.200068997e-02f,  6.469382552e-02f,  9.888979200e-02f,  1.356949539e-01f, \
                           1.768788149e-01f,  2.258729128e-01f,  2.918439922e-01f }

static __device__ __constant__ float turbo64_d_c3[8]  = TURBO64_CUDA_C3;
static __device__ __constant__ float turbo64_d_b3[7]  = TURBO64_CUDA_B3;
static __device__ __constant__ float turbo64_d_c2[4]  = TURBO64_CUDA_C2;
static __device__ __constant__ float turbo64_d_b2[3]  = TURBO64_CUDA_B2;
static __device__ __constant__ float turbo64_d_c4[16] = TURBO64_CUDA_C4;
static __device__ __constant__ float turbo64_d_b4[15] = TURBO64_CUDA_B4;

// ---- encode helpers shared by the KV writes (cuda/host-check/ compiles this part on the host)
// the code of y and its centroid: the boundaries ascend, so the ones below y are a prefix, the count is the code
// (bits: 4 turbo4, 3 turbo3, 2 turbo2)
static __device__ __forceinline__ float turbo_centroid(const int bits, const int c) {
    return bits == 4 ? turbo_d_c4[c] : bits == 3 ? turbo_d_c3[c] : turbo_d_c2[c];
}
static __device__ __forceinline__ float turbo_boundary(const int bits, const int b) {
    return bits == 4 ? turbo_d_b4[b] : bits == 3 ? turbo_d_b3[b] : turbo_d_b2[b];
}
template <int bits>
static __device__ __forceinline__ int turbo_code_of(const float y, float & cv) {
    int c = 0;
    cv = turbo_centroid(bits, 0);
#pragma unroll
    for (int b = 0; b < (1 << bits) - 1; ++b) {
        if (y > turbo_boundary(bits, b)) {
            c = b + 1;
            cv = turbo_centroid(bits, b + 1);
        }
    }
    return c;
}

// the stored FP16 norm: the block's length len over its centroids' length clen (norm correction), times 2^e when
// the block was scaled by 2^-e first (two exact power-of-two multiplies), clamped to FP16's range; inv_sqrt_qk:
// 1/sqrt of the block's values (128, or 64 for the 64-value types)
static __device__ __forceinline__ uint16_t turbo_norm_half(const float len, const float clen, const int e,
        const float inv_sqrt_qk = TURBO_CUDA_INV_SQRT_QK) {
    float norm = __fdiv_rn(__fmul_rn(len, inv_sqrt_qk), clen);
    if (e != 0) {
        const int e1 = e / 2, e2 = e - e / 2;
        norm = __fmul_rn(__fmul_rn(norm, __uint_as_float((uint32_t) (127 + e1) << 23)),
                         __uint_as_float((uint32_t) (127 + e2) << 23));
    }
    if (!(norm <= TURBO_CUDA_FP16_MAX)) {
        norm = TURBO_CUDA_FP16_MAX;
    }
    return __half_as_ushort(__float2half_rn(norm));
}
// a huge block is scaled by 2^-e first: e is frexpf's exponent of amax (normal here: amax = m * 2^e, m in
// [0.5, 1)), and p1 * p2 = 2^-e as two exact power-of-two factors (2^-e alone may be subnormal)
static __device__ __forceinline__ int turbo_prescale(const float amax, float & p1, float & p2) {
    const int e = (int) ((__float_as_uint(amax) >> 23) & 0xffu) - 126;
    const int e1 = e / 2, e2 = e - e / 2;
    p1 = __uint_as_float((uint32_t) (127 - e1) << 23);
    p2 = __uint_as_float((uint32_t) (127 - e2) << 23);
    return e;
}
// ---- end of the encode helpers

// the NaN/Inf test of both warp encoders (a bit test: ggml-cuda builds with fast math; cuda/host-check's shims have
// their own copy, as this sits outside the parts they compile)
static __device__ __forceinline__ bool turbo_is_finite(const float x) {
    return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u;
}

void ggml_cuda_turbo_check_tables(void);

// The per-type facts of the K/V types that the turbo kernels read, in one table, derived from the block structs of
// ggml-turbo.h: qk values per block, bits per code, bs = sizeof(block_t); qsw, the 32-bit words of a block's codes as
// the scalar decode attention stages them (fattn-turbo.cuh; the 128-value types only, 0 for the rest, which it does
// not stage); row_bytes, the bytes of one block of a row (qk values; 128 for f16 and q8_0) as the tensor-core decode
// stages them (fattn-turbo-mma.cuh)
template <typename block, int QK, int BITS> struct turbo_traits_of_block {
    typedef block block_t;
    static constexpr int qk        = QK;
    static constexpr int bits      = BITS;
    static constexpr int bs        = (int) sizeof(block);
    static constexpr int qsw       = QK == QK_TURBO ? (int) sizeof(block::qs)/4 : 0;
    static constexpr int row_bytes = bs;
    static_assert(sizeof(block) == sizeof(uint16_t) + QK*BITS/8, "a turbo block is its norm and its codes");
};
template <ggml_type type> struct turbo_traits;
template <> struct turbo_traits<GGML_TYPE_TURBO3>    : turbo_traits_of_block<block_turbo3,    QK_TURBO,    3> {};
template <> struct turbo_traits<GGML_TYPE_TURBO2>    : turbo_traits_of_block<block_turbo2,    QK_TURBO,    2> {};
template <> struct turbo_traits<GGML_TYPE_TURBO4>    : turbo_traits_of_block<block_turbo4,    QK_TURBO,    4> {};
template <> struct turbo_traits<GGML_TYPE_TURBO3_64> : turbo_traits_of_block<block_turbo3_64, QK_TURBO_64, 3> {};
template <> struct turbo_traits<GGML_TYPE_TURBO2_64> : turbo_traits_of_block<block_turbo2_64, QK_TURBO_64, 2> {};
template <> struct turbo_traits<GGML_TYPE_TURBO4_64> : turbo_traits_of_block<block_turbo4_64, QK_TURBO_64, 4> {};
// the plain partners of a turbo K or V: no codes, 128 values per staged block
template <> struct turbo_traits<GGML_TYPE_F16> {
    static constexpr int qk = 0, bits = 0, bs = 0, qsw = 0;
    static constexpr int row_bytes = QK_TURBO*(int) sizeof(half);
};
template <> struct turbo_traits<GGML_TYPE_Q8_0> {
    static constexpr int qk = 0, bits = 0, bs = 0, qsw = 0;
    static constexpr int row_bytes = QK_TURBO/QK8_0*(int) sizeof(block_q8_0);
};
// the host's view of the same: the code bits of a turbo type (its block size: ggml_cuda_turbo_qk)
static constexpr int ggml_cuda_turbo_bits(const ggml_type t) {
    return t == GGML_TYPE_TURBO4 || t == GGML_TYPE_TURBO4_64 ? 4 : t == GGML_TYPE_TURBO3 || t == GGML_TYPE_TURBO3_64 ? 3 : 2;
}

// centroid c of the codebook of a block of qk values (128: turbo_centroid; 64: the d = 64 codebooks)
template <int qk>
static __device__ __forceinline__ float turbo_centroid_qk(const int bits, const int c) {
    if (qk == QK_TURBO_64) {
        return bits == 4 ? turbo64_d_c4[c] : bits == 3 ? turbo64_d_c3[c] : turbo64_d_c2[c];
    }
    return turbo_centroid(bits, c);
}

static __device__ __forceinline__ bool turbo_sign_neg(const int i) {
    return (turbo_d_sign_words[i >> 5] >> (i & 31)) & 1u;
}

// One warp per 128-block (blocks of 8 warps): the warp's index, in 32 bits (the launchers check that the block
// count fits: 64-bit divisions are long instruction sequences, and a decode step's write is latency).
static __device__ __forceinline__ int turbo_warp_index() {
    return (int) (blockIdx.x*(blockDim.x/WARP_SIZE) + threadIdx.x/WARP_SIZE);
}

// where block wid sits in a walk over (block of a row, dim 1, dim 2, dim 3), the block index fastest
struct turbo_block_pos {
    int ib, i1, i2, i3;
};
static __device__ __forceinline__ turbo_block_pos turbo_block_at(const int wid, const int nbr, const int ne1, const int ne2) {
    int r = wid / nbr;
    turbo_block_pos b;
    b.ib = wid - r*nbr;
    b.i1 = r % ne1; r /= ne1;
    b.i2 = r % ne2;
    b.i3 = r / ne2;
    return b;
}

// In-warp unnormalized FWHT of 128 values, butterflies of span 1, 2, ..., 64 exactly as the C code:
// t[j] = a + b, t[j+h] = a - b with a the lower index.
static __device__ __forceinline__ void turbo_warp_fwht(float v[4], const int lane) {
#pragma unroll
    for (int h = 1; h < 32; h *= 2) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const float o = __shfl_xor_sync(0xffffffff, v[k], h);
            v[k] = (lane & h) ? __fsub_rn(o, v[k]) : __fadd_rn(v[k], o);
        }
    }
    // span 32: (k, k+1) for k = 0, 2
    {
        const float a0 = v[0], b0 = v[1], a1 = v[2], b1 = v[3];
        v[0] = __fadd_rn(a0, b0); v[1] = __fsub_rn(a0, b0);
        v[2] = __fadd_rn(a1, b1); v[3] = __fsub_rn(a1, b1);
    }
    // span 64: (k, k+2) for k = 0, 1
    {
        const float a0 = v[0], b0 = v[2], a1 = v[1], b1 = v[3];
        v[0] = __fadd_rn(a0, b0); v[2] = __fsub_rn(a0, b0);
        v[1] = __fadd_rn(a1, b1); v[3] = __fsub_rn(a1, b1);
    }
}

// ---- the 64-point FWHT (cuda/host-check/turbo64_check.sh compiles it with the 64-value warp helpers below)
// unnormalized FWHT of 64 values, butterflies of span 1, 2, ..., 32 as the C code (t[j] = a + b, t[j+h] = a - b)
static __device__ __forceinline__ void turbo64_warp_fwht(float v[2], const int lane) {
#pragma unroll
    for (int h = 1; h < 32; h *= 2) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const float o = __shfl_xor_sync(0xffffffff, v[k], h);
            v[k] = (lane & h) ? __fsub_rn(o, v[k]) : __fadd_rn(v[k], o);
        }
    }
    const float a = v[0], b = v[1];   // span 32
    v[0] = __fadd_rn(a, b);
    v[1] = __fsub_rn(a, b);
}
// ---- end of the 64-point FWHT

// ---- the block in one warp: value lane + 32k in v[k], k = 0, 1 -------------------------------------------------------
// (the 64-value instances of turbo.cu's writes and reads; from here to "end of the warp helpers",
// cuda/host-check/turbo64_check.sh compiles the code as host code with the warp's 32 lanes emulated, against the C
// reference)
static __device__ __forceinline__ float turbo64_centroid(const int bits, const int c) {
    return bits == 4 ? turbo64_d_c4[c] : bits == 3 ? turbo64_d_c3[c] : turbo64_d_c2[c];
}
static __device__ __forceinline__ float turbo64_boundary(const int bits, const int b) {
    return bits == 4 ? turbo64_d_b4[b] : bits == 3 ? turbo64_d_b3[b] : turbo64_d_b2[b];
}


// pairwise tree sum of 64 values (s[i] += s[i + h], h = 32..1), broadcast to all lanes
static __device__ __forceinline__ float turbo64_warp_tree_sum(const float s[2]) {
    float a = __fadd_rn(s[0], s[1]);   // h = 32
#pragma unroll
    for (int h = 16; h >= 1; h /= 2) {
        a = __fadd_rn(a, __shfl_down_sync(0xffffffff, a, h));
    }
    return __shfl_sync(0xffffffff, a, 0);
}

template <int bits>
static __device__ __forceinline__ int turbo64_code_of(const float y, float & cv) {
    int c = 0;
    cv = turbo64_centroid(bits, 0);
#pragma unroll
    for (int b = 0; b < (1 << bits) - 1; ++b) {
        if (y > turbo64_boundary(bits, b)) {
            c = b + 1;
            cv = turbo64_centroid(bits, b + 1);
        }
    }
    return c;
}

// turbo_encode_block (cpu_ref/ggml-turbo.c) for qk = 64: returns the FP16 norm bits, codes[k] of value lane + 32k
// (all 0 for the zero block)
template <int bits>
static __device__ __forceinline__ uint16_t turbo64_warp_encode(const float x[2], int codes[2], const int lane) {
    bool bad = false;
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        bad |= !turbo_is_finite(x[k]);
        const float a = fabsf(x[k]);
        amax = a > amax ? a : amax;
        codes[k] = 0;
    }
    bad = __any_sync(0xffffffff, bad);
#pragma unroll
    for (int h = 16; h >= 1; h /= 2) {
        const float o = __shfl_xor_sync(0xffffffff, amax, h);
        amax = o > amax ? o : amax;
    }
    if (bad || amax == 0.0f) {
        return 0;
    }
    int e = 0;
    float p1 = 1.0f, p2 = 1.0f;
    if (amax > TURBO_CUDA_BIG_AMAX) {
        e = turbo_prescale(amax, p1, p2);
    }
    float t[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        t[k] = e != 0 ? __fmul_rn(__fmul_rn(x[k], p1), p2) : x[k];
        if (turbo_sign_neg(lane + 32*k)) {
            t[k] = -t[k];
        }
    }
    turbo64_warp_fwht(t, lane);
    float s[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        s[k] = __fmul_rn(t[k], t[k]);
    }
    const float len = __fsqrt_rn(turbo64_warp_tree_sum(s));
    if (!(len > 0.0f)) {
        return 0;
    }
    const float inv = __fdiv_rn(1.0f, len);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        float cv;
        codes[k] = turbo64_code_of<bits>(__fmul_rn(t[k], inv), cv);
        s[k] = __fmul_rn(cv, cv);
    }
    return turbo_norm_half(len, __fsqrt_rn(turbo64_warp_tree_sum(s)), e, TURBO64_INV_SQRT);
}

// the block (norm + packed codes) from the warp's codes; a zero norm stores all codes 0
template <int bits>
static __device__ __forceinline__ void turbo64_warp_store(uint8_t * dst_block, const uint16_t norm, const int codes[2], const int lane) {
    uint8_t * qs = dst_block + 2;
    if (lane == 0) {
        // the norm as two bytes: a 64-value block of 18 or 26 bytes is 2-byte aligned, but keep to bytes as the rows may
        // start anywhere a view puts them
        dst_block[0] = (uint8_t) (norm & 0xff);
        dst_block[1] = (uint8_t) (norm >> 8);
    }
    if (bits == 4) {
        // byte j = code 2j | code 2j+1 << 4 (j = lane): codes 2l, 2l+1 sit in lanes (2l) % 32, (2l+1) % 32, slot l / 16
        const int w = codes[0] | (codes[1] << 4);
        const int o0 = __shfl_sync(0xffffffff, w, (2*lane) & 31);
        const int o1 = __shfl_sync(0xffffffff, w, (2*lane + 1) & 31);
        const int s = 4*(lane >> 4);
        qs[lane] = norm ? (uint8_t) (((o0 >> s) & 15) | (((o1 >> s) & 15) << 4)) : 0;
        return;
    }
    // low plane byte j (j = lane < 16): codes 4j..4j+3 in lanes (4j+m) % 32, slot j / 8
    const int w = codes[0] | (codes[1] << 3);
    const int kk = (lane >> 3) & 1;
    int lo = 0;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
        const int o = __shfl_sync(0xffffffff, w, (4*lane + m) & 31);
        lo |= ((o >> (3*kk)) & 3) << (2*m);
    }
    const uint32_t hb0 = __ballot_sync(0xffffffff, (codes[0] >> 2) & 1);
    const uint32_t hb1 = __ballot_sync(0xffffffff, (codes[1] >> 2) & 1);
    if (lane < 16) {
        qs[lane] = norm ? (uint8_t) lo : 0;
    }
    if (bits == 3 && lane < 8) {   // high plane byte j = bit 2 of codes 8j..8j+7
        const uint32_t word = lane < 4 ? hb0 : hb1;
        qs[16 + lane] = norm ? (uint8_t) (word >> (8*(lane & 3))) : 0;
    }
}

static __device__ __forceinline__ uint16_t turbo64_load_norm(const uint8_t * b) {
    return (uint16_t) (b[0] | (b[1] << 8));
}

// code i of a block's qs
template <int bits>
static __device__ __forceinline__ int turbo64_code(const uint8_t * qs, const int i) {
    if (bits == 4) {
        return (qs[i >> 1] >> (4*(i & 1))) & 15;
    }
    int c = (qs[i >> 2] >> (2*(i & 3))) & 3;
    if (bits == 3) {
        c |= ((qs[16 + (i >> 3)] >> (i & 7)) & 1) << 2;
    }
    return c;
}

// dequantize_row_turbo*_64 of one block: x[k] = value lane + 32k
template <int bits>
static __device__ __forceinline__ void turbo64_warp_decode(const uint8_t * blk, float x[2], const int lane) {
    const float scale = __fmul_rn(__half2float(__ushort_as_half(turbo64_load_norm(blk))), TURBO64_INV_SQRT);
    const float book = turbo64_centroid(bits, lane & ((1 << bits) - 1));
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int c = turbo64_code<bits>(blk + 2, lane + 32*k);
        x[k] = __fmul_rn(__shfl_sync(0xffffffff, book, c), scale);
    }
    turbo64_warp_fwht(x, lane);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        if (turbo_sign_neg(lane + 32*k)) {
            x[k] = -x[k];
        }
    }
}

// the block in the decoder's rotated domain (norm x centroid, as f32 before any rounding to f16): x[k] of value lane + 32k
template <int bits>
static __device__ __forceinline__ void turbo64_warp_decode_rotated(const uint8_t * blk, float x[2], const int lane) {
    const float norm = __half2float(__ushort_as_half(turbo64_load_norm(blk)));
    const float book = turbo64_centroid(bits, lane & ((1 << bits) - 1));
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int c = turbo64_code<bits>(blk + 2, lane + 32*k);
        x[k] = norm*__shfl_sync(0xffffffff, book, c);
    }
}

// R x = H D x (H normalized) of the warp's block, the same float operations as turbo_rotate_forward_qk
static __device__ __forceinline__ void turbo64_warp_rotate(float v[2], const int lane) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        v[k] = turbo_sign_neg(lane + 32*k) ? -v[k] : v[k];
    }
    turbo64_warp_fwht(v, lane);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        v[k] = __fmul_rn(v[k], TURBO64_INV_SQRT);
    }
}

// R^-1 x = D H x, as turbo_rotate_inverse_qk
static __device__ __forceinline__ void turbo64_warp_unrotate(float v[2], const int lane) {
    turbo64_warp_fwht(v, lane);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        v[k] = __fmul_rn(v[k], TURBO64_INV_SQRT);
        v[k] = turbo_sign_neg(lane + 32*k) ? -v[k] : v[k];
    }
}

// ---- end of the warp helpers

// Pairwise tree sum of 128 values (s[i] += s[i+h], h = 64..1), result broadcast to all lanes.
static __device__ __forceinline__ float turbo_warp_tree_sum(const float s[4]) {
    float a = __fadd_rn(s[0], s[2]);          // h = 64: i = lane
    const float b = __fadd_rn(s[1], s[3]);    //         i = lane + 32
    a = __fadd_rn(a, b);                      // h = 32
#pragma unroll
    for (int h = 16; h >= 1; h /= 2) {
        const float o = __shfl_down_sync(0xffffffff, a, h);
        a = __fadd_rn(a, o);                  // meaningful for lane < h: s[lane] + s[lane + h]
    }
    return __shfl_sync(0xffffffff, a, 0);
}

// Encodes the block held by the warp; returns the fp16 norm bits, writes codes[k] for value lane+32k (all
// codes are 0 when the norm is 0: the zero block). Latency matters here (a decode step writes a handful of
// blocks per launch), so independent chains run side by side: the FWHT of the unscaled block beside the amax
// reduction (a block that needs the pre-scaling, amax > 2^32, is transformed again), and the centroids of the
// codes are picked while counting the boundaries (no divergent table loads).
template <int bits>
static __device__ __forceinline__ uint16_t turbo_warp_encode(const float x[4], int codes[4], const int lane) {
    bool bad = false;
    float amax = 0.0f;
    float t[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        bad |= !turbo_is_finite(x[k]);
        const float a = fabsf(x[k]);
        amax = a > amax ? a : amax;
        t[k] = turbo_sign_neg(lane + 32*k) ? -x[k] : x[k];
    }
    bad = __any_sync(0xffffffff, bad);
    turbo_warp_fwht(t, lane);
#pragma unroll
    for (int h = 16; h >= 1; h /= 2) {
        const float o = __shfl_xor_sync(0xffffffff, amax, h);
        amax = o > amax ? o : amax;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        codes[k] = 0;
    }
    if (bad || amax == 0.0f) {
        return 0;
    }
    int e = 0;
    if (amax > TURBO_CUDA_BIG_AMAX) {
        float p1, p2;
        e = turbo_prescale(amax, p1, p2);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            t[k] = __fmul_rn(__fmul_rn(x[k], p1), p2);
            if (turbo_sign_neg(lane + 32*k)) {
                t[k] = -t[k];
            }
        }
        turbo_warp_fwht(t, lane);
    }

    float s[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        s[k] = __fmul_rn(t[k], t[k]);
    }
    const float len = __fsqrt_rn(turbo_warp_tree_sum(s));
    if (!(len > 0.0f)) {
        return 0;
    }
    const float inv = __fdiv_rn(1.0f, len);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        float cv;
        codes[k] = turbo_code_of<bits>(__fmul_rn(t[k], inv), cv);
        s[k] = __fmul_rn(cv, cv);
    }
    return turbo_norm_half(len, __fsqrt_rn(turbo_warp_tree_sum(s)), e);
}

// Writes the block (norm + packed codes) from the warp's codes.
// A zero norm (the zero block, or a norm below FP16's range) stores all codes 0, whatever codes holds: the
// packing does not wait for the norm.
template <int bits>
static __device__ __forceinline__ void turbo_warp_store(uint8_t * dst_block, const uint16_t norm, const int codes[4], const int lane) {
    if (bits == 4) {
        // turbo4: byte j = code 2j | code 2j+1 << 4. Lane l writes bytes l and l + 32: codes 2l, 2l + 1 (and + 64) sit
        // in lanes 2l % 32 and (2l + 1) % 32, slot l / 16 (and + 2)
        const int w4 = codes[0] | (codes[1] << 4) | (codes[2] << 8) | (codes[3] << 12);
        const int o0 = __shfl_sync(0xffffffff, w4, (2*lane) & 31);
        const int o1 = __shfl_sync(0xffffffff, w4, (2*lane + 1) & 31);
        const int s0 = 4*(lane >> 4), s1 = s0 + 8;
        const int b0 = ((o0 >> s0) & 15) | (((o1 >> s0) & 15) << 4);
        const int b1 = ((o0 >> s1) & 15) | (((o1 >> s1) & 15) << 4);
        if (lane == 0) {
            *(uint16_t *) dst_block = norm;
        }
        uint8_t * qs = dst_block + 2;
        qs[lane]      = norm ? (uint8_t) b0 : 0;
        qs[lane + 32] = norm ? (uint8_t) b1 : 0;
        return;
    }
    const int w = codes[0] | (codes[1] << 3) | (codes[2] << 6) | (codes[3] << 9);
    // low plane byte j = lane: codes 4j..4j+3, which live in lanes (4j+m) % 32, slot k = j / 8
    const int kk = lane >> 3;
    int lo = 0;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
        const int o = __shfl_sync(0xffffffff, w, (4*lane + m) & 31);
        lo |= ((o >> (3*kk)) & 3) << (2*m);
    }
    uint32_t hb[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        hb[k] = __ballot_sync(0xffffffff, (codes[k] >> 2) & 1);
    }
    if (lane == 0) {
        *(uint16_t *) dst_block = norm;
    }
    uint8_t * qs = dst_block + 2;
    qs[lane] = norm ? (uint8_t) lo : 0;
    if (bits == 3 && lane < 16) {
        const int k = lane >> 2;
        const uint32_t word = k == 0 ? hb[0] : k == 1 ? hb[1] : k == 2 ? hb[2] : hb[3];
        qs[32 + lane] = norm ? (uint8_t) (word >> (8*(lane & 3))) : 0;
    }
}

// Decodes the block into x[k] = value lane + 32k, same float operations as dequantize_row_turbo*.
template <int bits>
static __device__ __forceinline__ void turbo_warp_decode(const uint8_t * src_block, float x[4], const int lane) {
    const uint16_t nh = *(const uint16_t *) src_block;
    const float scale = __fmul_rn(__half2float(__ushort_as_half(nh)), TURBO_CUDA_INV_SQRT_QK);
    const uint8_t * qs = src_block + 2;
    // the codebook sits in lanes 0..7 (0..15 for turbo4; one load of 8 or 16 addresses), a code's centroid comes by shuffle: a
    // constant-memory load with per-lane addresses would be serialised up to 8 ways
    const float book = turbo_centroid(bits, lane & ((1 << bits) - 1));
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int i = lane + 32*k;
        int c = bits == 4 ? (qs[i >> 1] >> (4*(i & 1))) & 15 : (qs[i >> 2] >> (2*(i & 3))) & 3;
        if (bits == 3) {
            c |= ((qs[32 + (i >> 3)] >> (i & 7)) & 1) << 2;
        }
        x[k] = __fmul_rn(__shfl_sync(0xffffffff, book, c), scale);
    }
    turbo_warp_fwht(x, lane);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        if (turbo_sign_neg(lane + 32*k)) {
            x[k] = -x[k];
        }
    }
}

// ---- RoPE on load -------------------------------------------------------------------------------------------------
// upstream's ROPE (normal or neox), done by a turbo kernel on the values it loads: the K rows when llama's RoPE of K
// is fused into the K write (patch 0018: a launch fewer per layer and token), q in the decode attention kernel when
// Q's RoPE is deferred into it (patches 0020-0021). The same float operations as ggml-cuda's rope
// kernels (rope.cu), per value (cuda/host-check/rope_check.sh compares them with ggml's CPU ROPE)
struct turbo_rope {
    const int32_t * pos;   // one position per token (row); nullptr: no rope
    const float * freq_factors;
    // a MUL before the ROPE folded into it (ggml_cuda_turbo_rope_mul_fusable): x*mul[e] per value e of a head, the
    // same f32 product as ggml-cuda's MUL, before the rotation; nullptr: none
    const float * mul;
    int D, n_dims, n_offs, neox;
    float theta_scale, freq_scale, ext_factor, attn_factor, corr0, corr1;
};

// the global values a RoPE of the lane's values reads besides its position (the folded MUL's row, the frequency
// factors), which the kernels load beside their inputs: read where they were used, each was a trip to L2 of its own
// inside the kernel's chain (and four more on a model with factors, as Llama 3's: one per value, behind a branch each)
template <int NV = 4>
struct turbo_rope_pre {
    float mul[NV];   // r.mul[e0 + lane + 32k] (unused without a MUL)
    float ff[NV];    // the frequency factor of the value's pair, 1 without factors (as upstream divides by 1 then)
};

// pair iw (its first index relative to n_offs) of value e of a head, for e in the rotated dims
static __device__ __forceinline__ int turbo_rope_pair(const turbo_rope & r, const int e) {
    return r.neox ? 2*((e - r.n_offs) % (r.n_dims/2)) : (e - r.n_offs) & ~1;
}
static __device__ __forceinline__ bool turbo_rope_rotated(const turbo_rope & r, const int e) {
    return e >= r.n_offs && e < r.n_offs + r.n_dims;
}

template <int NV = 4>
static __device__ __forceinline__ void turbo_rope_preload(const turbo_rope & r, const int e0, const int lane,
        turbo_rope_pre<NV> & pre) {
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int e = e0 + lane + 32*k;
        pre.mul[k] = r.mul ? r.mul[e] : 1.0f;
        pre.ff[k] = r.freq_factors ? r.freq_factors[turbo_rope_rotated(r, e) ? turbo_rope_pair(r, e)/2 : 0] : 1.0f;
    }
}

// cos and sin of the rotation of pair iw (its first index relative to n_offs), YaRN-corrected as upstream does; ff:
// the pair's frequency factor (turbo_rope_preload)
static __device__ __forceinline__ void turbo_rope_cs(const turbo_rope & r, const float p, const int iw, const float ff,
        float & c, float & s) {
    const float theta_base = p*powf(r.theta_scale, iw/2.0f);
    const float theta_extrap = theta_base/ff;
    const float theta_interp = r.freq_scale*theta_extrap;
    float theta = theta_interp;
    float mscale = r.attn_factor;
    if (r.ext_factor != 0.0f) {
        const float y = (iw/2 - r.corr0) / fmaxf(0.001f, r.corr1 - r.corr0);
        const float ramp_mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y)))*r.ext_factor;
        theta = theta_interp*(1 - ramp_mix) + theta_extrap*ramp_mix;
        mscale *= 1.0f + 0.1f*logf(1.0f/r.freq_scale);
    }
    c = cosf(theta)*mscale;
    s = sinf(theta)*mscale;
}

// the lane's cos and sin for its values lane + 32k (k < NV: 4 in a 128-value block, 2 in a 64-value one) of the block
// that starts at index e0 of its head (1 and 0 for values outside the rotated dims, which turbo_rope_apply leaves as
// they are)
template <int NV = 4>
static __device__ __forceinline__ void turbo_rope_block_cs(const turbo_rope & r, const int e0, const int32_t pos,
        const turbo_rope_pre<NV> & pre, const int lane, float c[NV], float s[NV]) {
    const float p = (float) pos;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int e = e0 + lane + 32*k;
        c[k] = 1.0f; s[k] = 0.0f;
        if (turbo_rope_rotated(r, e)) {
            turbo_rope_cs(r, p, turbo_rope_pair(r, e), pre.ff[k], c[k], s[k]);
        }
    }
}

// rotates the warp's block with the lane's cos and sin (turbo_rope_block_cs): normal pairs (2m, 2m + 1) sit in
// neighbouring lanes, neox pairs (m, m + 16 NV) of a head as wide as the block in the same lane (the host checks this).
// A neox pair of a wider head spans two blocks: those RoPEs stay upstream's (ggml_cuda_turbo_rope_on_load_ok)
template <int NV = 4>
static __device__ __forceinline__ void turbo_rope_apply(const turbo_rope & r, float v[NV], const int e0, const float c[NV],
        const float s[NV], const turbo_rope_pre<NV> & pre, const int lane) {
    if (r.mul) {   // warp-uniform; a partner's product is its own lane's (or this lane's other value's)
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            v[k] = __fmul_rn(v[k], pre.mul[k]);   // never contracted into an FMA: MUL's x*y exactly
        }
    }
    float o[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int e = e0 + lane + 32*k;
        const float partner = r.neox ? v[k ^ (NV/2)] : __shfl_xor_sync(0xffffffff, v[k], 1);
        o[k] = v[k];
        if (e < r.n_offs || e >= r.n_offs + r.n_dims) {
            continue;
        }
        const bool first = r.neox ? (e - r.n_offs) < r.n_dims/2 : ((e - r.n_offs) & 1) == 0;
        const float x0 = first ? v[k] : partner, x1 = first ? partner : v[k];
        o[k] = first ? x0*c[k] - x1*s[k] : x0*s[k] + x1*c[k];
    }
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        v[k] = o[k];
    }
}

// rotates the warp's block: value lane + 32k sits at index e0 + lane + 32k of its head; pre: turbo_rope_preload's
template <int NV = 4>
static __device__ __forceinline__ void turbo_rope_block(const turbo_rope & r, float v[NV], const int e0, const int32_t pos,
        const turbo_rope_pre<NV> & pre, const int lane) {
    float c[NV], s[NV];
    turbo_rope_block_cs<NV>(r, e0, pos, pre, lane, c, s);
    turbo_rope_apply<NV>(r, v, e0, c, s, pre, lane);
}

// the ROPE node's parameters (host); r.pos = its positions, r.freq_factors = its frequency factors or nullptr; with mul
// (the MUL that makes the ROPE's input, ggml_cuda_turbo_rope_mul_fusable) r.mul = its per-dim row. Gives the tensor the
// kernel reads in place of the ROPE's output: the ROPE's input, or the MUL's (the same layout, checked by the callers)
const ggml_tensor * ggml_cuda_turbo_rope_params(const ggml_tensor * rope, const ggml_tensor * mul, turbo_rope & r);
// ---- end of RoPE on load
