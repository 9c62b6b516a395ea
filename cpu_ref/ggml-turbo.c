// turbo4 / turbo3 / turbo2 reference implementation, for 128-value blocks and the 64-value blocks of the
// _64 types (head_dim 64 models). The format is described in ggml-turbo.h. Every function below takes the
// block size qk (64 or 128) and the code width bits (4, 3 or 2); the public names fix both.
//
// Every floating-point step of the encoder has a fixed order (butterflies, pairwise trees),
// so that the CUDA encoder (cuda/turbo-quant.cuh) can reproduce the bytes exactly.
// Contraction of a*b+c into an FMA would change rounding, hence the pragmas below.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#include "ggml-turbo.h"
#include "turbo-codebooks.h"
#include "turbo-codebooks-64.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

// The attention helpers (turbo*_dot_rotated, turbo*_mad_rotated) have an AVX2+FMA path. This file is built
// into ggml-base, which gets no -march flags, so on GCC/Clang x86 the path is compiled with a target
// attribute and chosen at run time (turbo_use_avx2); the encoder and decoder are plain C everywhere.
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define TURBO_AVX2 1
#define TURBO_AVX2_FN
#elif (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define TURBO_AVX2 1
#define TURBO_AVX2_DISPATCH 1
#define TURBO_AVX2_FN __attribute__((target("avx2,fma")))
#endif

#define TURBO_INV_SQRT_QK 0.0883883476483184405f  // 1/sqrt(128)
#define TURBO_INV_SQRT_64 0.125f                  // 1/sqrt(64)
#define TURBO_FP16_MAX    65504.0f
#define TURBO_BIG_AMAX    4294967296.0f           // 2^32: above this the squares could overflow

// ---- FP16 ---------------------------------------------------------------------------------

uint16_t turbo_fp32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    const uint16_t sign = (uint16_t) ((x >> 16) & 0x8000u);
    const uint32_t ax   = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {                    // Inf or NaN
        return sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u);
    }
    if (ax >= 0x477ff000u) {                    // >= 65520 rounds to Inf
        return sign | 0x7c00u;
    }
    if (ax < 0x38800000u) {                     // below 2^-14: a subnormal half (or zero)
        float af;
        memcpy(&af, &ax, sizeof(af));
        // af * 2^24 is exact; nearbyintf rounds half to even in the default rounding mode
        return sign | (uint16_t) nearbyintf(af * 16777216.0f);
    }
    uint32_t h = ((((ax >> 23) - 127u + 15u) << 10) | ((ax & 0x7fffffu) >> 13));
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) {
        h++;                                    // a carry into the exponent is the right result
    }
    return sign | (uint16_t) h;
}

float turbo_fp16_to_fp32(uint16_t h) {
    const uint32_t sign = (uint32_t) (h & 0x8000u) << 16;
    const uint32_t e    = (h >> 10) & 0x1fu;
    const uint32_t m    = h & 0x3ffu;
    uint32_t bits;
    if (e == 0) {
        const float v = (float) m * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (e == 31) {
        bits = sign | 0x7f800000u | (m << 13);
    } else {
        bits = sign | ((e - 15u + 127u) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

// ---- rotation -----------------------------------------------------------------------------

static inline bool turbo_sign_negative(int i) {
    return (turbo_sign_words[i >> 5] >> (i & 31)) & 1u;
}

// 1/sqrt(qk), the normalization of the qk-point Walsh-Hadamard transform
static inline float turbo_inv_sqrt(int qk) {
    return qk == QK_TURBO_64 ? TURBO_INV_SQRT_64 : TURBO_INV_SQRT_QK;
}

// In-place unnormalized Walsh-Hadamard transform of qk values, butterflies of span 1, 2, ..., qk/2.
static void turbo_fwht(float * t, int qk) {
    for (int h = 1; h < qk; h *= 2) {
        for (int i = 0; i < qk; i += 2*h) {
            for (int j = i; j < i + h; j++) {
                const float a = t[j];
                const float b = t[j + h];
                t[j]     = a + b;
                t[j + h] = a - b;
            }
        }
    }
}

// a qk-value block takes the first qk signs of the diagonal
static inline void turbo_apply_signs(float * t, int qk) {
    for (int i = 0; i < qk; i++) {
        if (turbo_sign_negative(i)) {
            t[i] = -t[i];
        }
    }
}

// forward: x <- H D x per block; inverse: x <- D H x (H orthonormal, H = H^T = H^-1)
static void turbo_rotate_blocks(float * x, int64_t k, int qk, bool inverse) {
    assert(qk == QK_TURBO || qk == QK_TURBO_64);
    const float inv = turbo_inv_sqrt(qk);
    for (int64_t ib = 0; ib < k / qk; ib++) {
        float * t = x + ib*qk;
        if (!inverse) {
            turbo_apply_signs(t, qk);
        }
        turbo_fwht(t, qk);
        for (int i = 0; i < qk; i++) {
            t[i] = t[i] * inv;
        }
        if (inverse) {
            turbo_apply_signs(t, qk);
        }
    }
}

void turbo_rotate_forward_qk(float * x, int64_t k, int qk) {
    turbo_rotate_blocks(x, k, qk, false);
}

void turbo_rotate_inverse_qk(float * x, int64_t k, int qk) {
    turbo_rotate_blocks(x, k, qk, true);
}

void turbo_rotate_forward(float * x, int64_t k) {
    turbo_rotate_forward_qk(x, k, QK_TURBO);
}

void turbo_rotate_inverse(float * x, int64_t k) {
    turbo_rotate_inverse_qk(x, k, QK_TURBO);
}

// ---- encoder ------------------------------------------------------------------------------

// Sum of qk values by a pairwise tree: s[i] += s[i + h] for h = qk/2, ..., 2, 1. Destroys s.
static float turbo_tree_sum(float * s, int qk) {
    for (int h = qk/2; h >= 1; h /= 2) {
        for (int i = 0; i < h; i++) {
            s[i] = s[i] + s[i + h];
        }
    }
    return s[0];
}

// Encodes one block of qk values into codes[qk] and returns the FP16 norm (0 for the zero block).
static uint16_t turbo_encode_block(const float * x, uint8_t * codes, int qk,
                                   const float * centroids, const float * boundaries, int n_boundaries) {
    float t[QK_TURBO];
    float amax = 0.0f;
    for (int i = 0; i < qk; i++) {
        if (!isfinite(x[i])) {
            memset(codes, 0, qk);
            return 0;
        }
        const float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    if (amax == 0.0f) {
        memset(codes, 0, qk);
        return 0;
    }
    // Huge blocks are scaled by a power of two (exact) so that the sum of squares stays finite.
    int e = 0;
    float pre = 1.0f;
    if (amax > TURBO_BIG_AMAX) {
        frexpf(amax, &e);
        pre = ldexpf(1.0f, -e);
    }
    for (int i = 0; i < qk; i++) {
        t[i] = x[i] * pre;
    }
    turbo_apply_signs(t, qk);
    turbo_fwht(t, qk);

    float s[QK_TURBO];
    for (int i = 0; i < qk; i++) {
        s[i] = t[i] * t[i];
    }
    const float len = sqrtf(turbo_tree_sum(s, qk));   // |t| = sqrt(qk) |x| (times pre)
    if (!(len > 0.0f)) {                              // squares underflowed: below FP16 range anyway
        memset(codes, 0, qk);
        return 0;
    }
    const float inv = 1.0f / len;
    for (int i = 0; i < qk; i++) {
        const float y = t[i] * inv;
        int c = 0;
        for (int b = 0; b < n_boundaries; b++) {
            c += y > boundaries[b];
        }
        codes[i] = (uint8_t) c;
        s[i] = centroids[c] * centroids[c];
    }
    const float clen = sqrtf(turbo_tree_sum(s, qk));  // |c|, never 0: no centroid is 0
    float norm = (len * turbo_inv_sqrt(qk)) / clen;
    if (e != 0) {
        norm = ldexpf(norm, e);
    }
    if (!(norm <= TURBO_FP16_MAX)) {
        norm = TURBO_FP16_MAX;                    // saturate: a norm is never Inf
    }
    const uint16_t h = turbo_fp32_to_fp16(norm);
    if (h == 0) {
        memset(codes, 0, qk);
    }
    return h;
}

static void turbo_pack_low(const uint8_t * codes, uint8_t * qs, int qk) {
    for (int j = 0; j < qk/4; j++) {
        qs[j] = (uint8_t) ((codes[4*j] & 3) | ((codes[4*j+1] & 3) << 2) |
                           ((codes[4*j+2] & 3) << 4) | ((codes[4*j+3] & 3) << 6));
    }
}

static void turbo_pack_high(const uint8_t * codes, uint8_t * qh, int qk) {
    for (int j = 0; j < qk/8; j++) {
        uint8_t b = 0;
        for (int l = 0; l < 8; l++) {
            b |= (uint8_t) (((codes[8*j + l] >> 2) & 1) << l);
        }
        qh[j] = b;
    }
}

// turbo4: one nibble per code, code i in byte i/2 (even i in the low nibble)
static void turbo_pack_nibbles(const uint8_t * codes, uint8_t * qs, int qk) {
    for (int j = 0; j < qk/2; j++) {
        qs[j] = (uint8_t) ((codes[2*j] & 15) | ((codes[2*j+1] & 15) << 4));
    }
}

// the codebook of a code width and block size
static inline const float * turbo_centroids(int bits, int qk) {
    if (qk == QK_TURBO_64) {
        return bits == 3 ? turbo3_64_centroids : bits == 4 ? turbo4_64_centroids : turbo2_64_centroids;
    }
    return bits == 3 ? turbo3_centroids : bits == 4 ? turbo4_centroids : turbo2_centroids;
}

static inline const float * turbo_boundaries(int bits, int qk) {
    if (qk == QK_TURBO_64) {
        return bits == 3 ? turbo3_64_boundaries : bits == 4 ? turbo4_64_boundaries : turbo2_64_boundaries;
    }
    return bits == 3 ? turbo3_boundaries : bits == 4 ? turbo4_boundaries : turbo2_boundaries;
}

// bytes of one block: the FP16 norm and qk codes of bits bits
static inline size_t turbo_block_bytes(int bits, int qk) {
    return sizeof(uint16_t) + (size_t) (qk * bits / 8);
}

// k values (a multiple of qk) to k/qk blocks of turbo_block_bytes(bits, qk) bytes
static void turbo_quantize_row(int bits, int qk, const float * x, void * y, int64_t k) {
    uint8_t codes[QK_TURBO];
    const size_t bs = turbo_block_bytes(bits, qk);
    for (int64_t ib = 0; ib < k / qk; ib++) {
        uint8_t * b = (uint8_t *) y + ib*bs;
        const uint16_t norm = turbo_encode_block(x + ib*qk, codes, qk, turbo_centroids(bits, qk),
                                                 turbo_boundaries(bits, qk), (1 << bits) - 1);
        memcpy(b, &norm, sizeof(norm));
        if (bits == 4) {
            turbo_pack_nibbles(codes, b + 2, qk);
        } else {
            turbo_pack_low(codes, b + 2, qk);
            if (bits == 3) {
                turbo_pack_high(codes, b + 2 + qk/4, qk);
            }
        }
    }
}

static size_t turbo_quantize_rows(int bits, int qk, const float * src, void * dst, int64_t nrows, int64_t n_per_row) {
    const size_t row_size = (size_t) (n_per_row / qk) * turbo_block_bytes(bits, qk);
    for (int64_t r = 0; r < nrows; r++) {
        turbo_quantize_row(bits, qk, src + r*n_per_row, (char *) dst + r*row_size, n_per_row);
    }
    return (size_t) nrows * row_size;
}

void quantize_row_turbo4_ref(const float * x, block_turbo4 * y, int64_t k) { turbo_quantize_row(4, QK_TURBO, x, y, k); }
void quantize_row_turbo3_ref(const float * x, block_turbo3 * y, int64_t k) { turbo_quantize_row(3, QK_TURBO, x, y, k); }
void quantize_row_turbo2_ref(const float * x, block_turbo2 * y, int64_t k) { turbo_quantize_row(2, QK_TURBO, x, y, k); }
void quantize_row_turbo4_64_ref(const float * x, block_turbo4_64 * y, int64_t k) { turbo_quantize_row(4, QK_TURBO_64, x, y, k); }
void quantize_row_turbo3_64_ref(const float * x, block_turbo3_64 * y, int64_t k) { turbo_quantize_row(3, QK_TURBO_64, x, y, k); }
void quantize_row_turbo2_64_ref(const float * x, block_turbo2_64 * y, int64_t k) { turbo_quantize_row(2, QK_TURBO_64, x, y, k); }

// ggml_quantize_chunk entry points (imatrix unused)
#define TURBO_QUANTIZE_CHUNK(name, bits, qk)                                                                   \
    size_t name(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix) {     \
        (void) imatrix;                                                                                         \
        return turbo_quantize_rows(bits, qk, src, dst, nrows, n_per_row);                                      \
    }
TURBO_QUANTIZE_CHUNK(quantize_turbo4, 4, QK_TURBO)
TURBO_QUANTIZE_CHUNK(quantize_turbo3, 3, QK_TURBO)
TURBO_QUANTIZE_CHUNK(quantize_turbo2, 2, QK_TURBO)
TURBO_QUANTIZE_CHUNK(quantize_turbo4_64, 4, QK_TURBO_64)
TURBO_QUANTIZE_CHUNK(quantize_turbo3_64, 3, QK_TURBO_64)
TURBO_QUANTIZE_CHUNK(quantize_turbo2_64, 2, QK_TURBO_64)

// ---- decoder ------------------------------------------------------------------------------

// code i of a block's qs (qk values): 2 low bits in the low plane, turbo3's bit 2 in the high plane at qs[qk/4]
static inline int turbo3_code(const uint8_t * qs, int i, int qk) {
    return ((qs[i >> 2] >> (2*(i & 3))) & 3) | (((qs[qk/4 + (i >> 3)] >> (i & 7)) & 1) << 2);
}

static inline int turbo2_code(const uint8_t * qs, int i) {
    return (qs[i >> 2] >> (2*(i & 3))) & 3;
}

static inline int turbo4_code(const uint8_t * qs, int i) {
    return (qs[i >> 1] >> (4*(i & 1))) & 15;
}

// code i of a block's qs for a type of the given bits (4, 3 or 2) and block size
static inline int turbo_code(int bits, int qk, const uint8_t * qs, int i) {
    return bits == 3 ? turbo3_code(qs, i, qk) : bits == 4 ? turbo4_code(qs, i) : turbo2_code(qs, i);
}

static void turbo_dequantize_row(int bits, int qk, const void * x, float * y, int64_t k) {
    const size_t bs = turbo_block_bytes(bits, qk);
    const float * cent = turbo_centroids(bits, qk);
    for (int64_t ib = 0; ib < k / qk; ib++) {
        const uint8_t * b = (const uint8_t *) x + ib*bs;
        uint16_t h;
        memcpy(&h, b, sizeof(h));
        const float scale = turbo_fp16_to_fp32(h) * turbo_inv_sqrt(qk);
        float * v = y + ib*qk;
        for (int i = 0; i < qk; i++) {     // the block's c vector in the rotated domain, times scale
            v[i] = cent[turbo_code(bits, qk, b + 2, i)] * scale;
        }
        turbo_fwht(v, qk);                 // unrotate
        turbo_apply_signs(v, qk);
    }
}

void dequantize_row_turbo4(const block_turbo4 * x, float * y, int64_t k) { turbo_dequantize_row(4, QK_TURBO, x, y, k); }
void dequantize_row_turbo3(const block_turbo3 * x, float * y, int64_t k) { turbo_dequantize_row(3, QK_TURBO, x, y, k); }
void dequantize_row_turbo2(const block_turbo2 * x, float * y, int64_t k) { turbo_dequantize_row(2, QK_TURBO, x, y, k); }
void dequantize_row_turbo4_64(const block_turbo4_64 * x, float * y, int64_t k) { turbo_dequantize_row(4, QK_TURBO_64, x, y, k); }
void dequantize_row_turbo3_64(const block_turbo3_64 * x, float * y, int64_t k) { turbo_dequantize_row(3, QK_TURBO_64, x, y, k); }
void dequantize_row_turbo2_64(const block_turbo2_64 * x, float * y, int64_t k) { turbo_dequantize_row(2, QK_TURBO_64, x, y, k); }

// ---- validation ---------------------------------------------------------------------------

int64_t turbo_first_invalid_block(const void * data, int64_t nblocks, size_t block_size) {
    const uint8_t * p = (const uint8_t *) data;
    for (int64_t ib = 0; ib < nblocks; ib++) {
        uint16_t h;
        memcpy(&h, p + ib*block_size, sizeof(h));
        if ((h & 0x7c00u) == 0x7c00u || (h & 0x8000u)) {   // Inf/NaN or negative
            return ib;
        }
    }
    return -1;
}

static bool turbo_validate_norms(const uint8_t * p, size_t nbytes, size_t block_size) {
    if (nbytes % block_size != 0) {
        return false;
    }
    return turbo_first_invalid_block(p, (int64_t) (nbytes / block_size), block_size) < 0;
}

bool turbo3_validate_row(const void * data, size_t nbytes) {
    return turbo_validate_norms((const uint8_t *) data, nbytes, sizeof(block_turbo3));
}

bool turbo2_validate_row(const void * data, size_t nbytes) {
    return turbo_validate_norms((const uint8_t *) data, nbytes, sizeof(block_turbo2));
}

bool turbo4_validate_row(const void * data, size_t nbytes) {
    return turbo_validate_norms((const uint8_t *) data, nbytes, sizeof(block_turbo4));
}

bool turbo_validate_row_qk(int bits, int qk, const void * data, size_t nbytes) {
    return turbo_validate_norms((const uint8_t *) data, nbytes, turbo_block_bytes(bits, qk));
}

// ---- fused attention helpers --------------------------------------------------------------

// the fp16 norm at the start of a block, as float
static inline float turbo_block_norm(const uint8_t * b) {
    uint16_t h;
    memcpy(&h, b, sizeof(h));
    return turbo_fp16_to_fp32(h);
}

#ifdef TURBO_AVX2
// 1 where the AVX2+FMA path runs: always when the file is built for it, else if the CPU has both
// (TURBO_NO_SIMD=1 keeps the plain C path, for comparisons)
static int turbo_use_avx2(void) {
    static int use = -1;   // decided once (a benign race: every thread computes the same value)
    if (use < 0) {
        const char * off = getenv("TURBO_NO_SIMD");
        int cpu = 1;
#ifdef TURBO_AVX2_DISPATCH
        __builtin_cpu_init();
        cpu = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
        use = cpu && !(off && atoi(off));
    }
    return use;
}

// Codes of values 8j..8j+7 as 8 int32 lanes: 2 low bits from 2 bytes of the low plane, the high bit
// (turbo3) from one byte of the high plane. The 8 (or 4) centroids sit in one register, so a lane's
// centroid is a single permute.
TURBO_AVX2_FN static inline __m256i turbo_low_codes8(const uint8_t * ql, int j) {
    const __m256i shifts = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const int lo = ql[2*j] | (ql[2*j + 1] << 8);
    return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(lo), shifts), _mm256_set1_epi32(3));
}

TURBO_AVX2_FN static inline __m256i turbo3_codes8(const uint8_t * qs, int j, int qk) {
    const __m256i bit = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i hi  = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(qs[qk/4 + j]), bit), _mm256_set1_epi32(1));
    return _mm256_or_si256(turbo_low_codes8(qs, j), _mm256_slli_epi32(hi, 2));
}

// turbo4: values 8j..8j+7 are the 8 nibbles of bytes 4j..4j+3
TURBO_AVX2_FN static inline __m256i turbo4_codes8(const uint8_t * qs, int j) {
    const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    uint32_t w;
    memcpy(&w, qs + 4*j, sizeof(w));
    return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int) w), shifts), _mm256_set1_epi32(15));
}

TURBO_AVX2_FN static inline float turbo_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// bits 3: the 8 centroids; bits 2: the 4 centroids twice (a 2-bit code never reaches lanes 4-7); bits 4: centroids
// 0-7 (turbo_table8_hi has 8-15)
TURBO_AVX2_FN static inline __m256 turbo_table8(int bits, int qk) {
    const float * c = turbo_centroids(bits, qk);
    return bits == 2 ? _mm256_setr_ps(c[0], c[1], c[2], c[3], c[0], c[1], c[2], c[3]) : _mm256_loadu_ps(c);
}

// the centroids of codes 8-15 (turbo4 only; never looked up for the other types)
TURBO_AVX2_FN static inline __m256 turbo_table8_hi(int bits, int qk) {
    return bits == 4 ? _mm256_loadu_ps(turbo_centroids(bits, qk) + 8) : _mm256_setzero_ps();
}

TURBO_AVX2_FN static inline __m256i turbo_codes8(int bits, int qk, const uint8_t * qs, int j) {
    return bits == 3 ? turbo3_codes8(qs, j, qk) : bits == 4 ? turbo4_codes8(qs, j) : turbo_low_codes8(qs, j);
}

// the 8 lanes' centroids (scaled tables give the scaled centroids: a permute does not round). A permute
// reads 3 bits of the index, so a 4-bit code picks from lo or hi by its bit 3 (shifted into the sign bit).
TURBO_AVX2_FN static inline __m256 turbo_lookup8(int bits, __m256 lo, __m256 hi, __m256i codes) {
    const __m256 c = _mm256_permutevar8x32_ps(lo, codes);
    if (bits != 4) {
        return c;
    }
    return _mm256_blendv_ps(c, _mm256_permutevar8x32_ps(hi, codes), _mm256_castsi256_ps(_mm256_slli_epi32(codes, 28)));
}

// The nq query heads that share a KV head (GQA; one head is nq = 1), from one decode of each block's codes (per
// group of up to 4 heads: their accumulators stay in registers). blocks: nb blocks of bs bytes (norm first, then
// the codes). The mad is the plain C loop's product, then sum, so the same results; the dot sums in 8 lanes.
TURBO_AVX2_FN static inline __attribute__((always_inline)) void turbo_dot4_avx2(int bits, int qk, const uint8_t * blocks,
        size_t bs, const float * q_rot, int64_t q_stride, const int n, float * out, int64_t nb) {
    const __m256 table = turbo_table8(bits, qk);
    const __m256 table_hi = turbo_table8_hi(bits, qk);
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t ib = 0; ib < nb; ib++) {
        const uint8_t * b = blocks + ib*bs;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int j = 0; j < qk/8; j++) {
            const __m256 c = turbo_lookup8(bits, table, table_hi, turbo_codes8(bits, qk, b + 2, j));
            for (int h = 0; h < n; h++) {
                acc[h] = _mm256_fmadd_ps(c, _mm256_loadu_ps(q_rot + h*q_stride + ib*qk + 8*j), acc[h]);
            }
        }
        const float norm = turbo_block_norm(b);
        for (int h = 0; h < n; h++) {
            sum[h] += turbo_hsum(acc[h]) * norm;
        }
    }
    for (int h = 0; h < n; h++) {
        out[h] = sum[h];
    }
}

TURBO_AVX2_FN static inline __attribute__((always_inline)) void turbo_dot_multi_avx2_bits(int bits, int qk,
        const uint8_t * blocks, size_t bs, const float * q_rot, int64_t q_stride, int nq, float * out, int64_t nb) {
    for (int h0 = 0; h0 < nq; h0 += 4) {
        const float * q = q_rot + h0*q_stride;
        switch (nq - h0) {
            case 1:  turbo_dot4_avx2(bits, qk, blocks, bs, q, q_stride, 1, out + h0, nb); break;
            case 2:  turbo_dot4_avx2(bits, qk, blocks, bs, q, q_stride, 2, out + h0, nb); break;
            case 3:  turbo_dot4_avx2(bits, qk, blocks, bs, q, q_stride, 3, out + h0, nb); break;
            default: turbo_dot4_avx2(bits, qk, blocks, bs, q, q_stride, 4, out + h0, nb); break;
        }
    }
}

TURBO_AVX2_FN static inline __attribute__((always_inline)) void turbo_mad4_avx2(int bits, int qk, const uint8_t * blocks,
        size_t bs, float * acc_rot, int64_t acc_stride, const float * w, const int n, int64_t nb) {
    for (int64_t ib = 0; ib < nb; ib++) {
        const uint8_t * b = blocks + ib*bs;
        const float norm = turbo_block_norm(b);
        __m256 table[4], table_hi[4];
        for (int h = 0; h < n; h++) {
            table[h]    = _mm256_mul_ps(turbo_table8(bits, qk), _mm256_set1_ps(w[h] * norm));
            table_hi[h] = _mm256_mul_ps(turbo_table8_hi(bits, qk), _mm256_set1_ps(w[h] * norm));
        }
        for (int j = 0; j < qk/8; j++) {
            const __m256i codes = turbo_codes8(bits, qk, b + 2, j);
            for (int h = 0; h < n; h++) {
                float * a = acc_rot + h*acc_stride + ib*qk + 8*j;
                _mm256_storeu_ps(a, _mm256_add_ps(_mm256_loadu_ps(a), turbo_lookup8(bits, table[h], table_hi[h], codes)));
            }
        }
    }
}

TURBO_AVX2_FN static inline __attribute__((always_inline)) void turbo_mad_multi_avx2_bits(int bits, int qk,
        const uint8_t * blocks, size_t bs, float * acc_rot, int64_t acc_stride, const float * w, int nq, int64_t nb) {
    for (int h0 = 0; h0 < nq; h0 += 4) {
        float * a = acc_rot + h0*acc_stride;
        switch (nq - h0) {
            case 1:  turbo_mad4_avx2(bits, qk, blocks, bs, a, acc_stride, w + h0, 1, nb); break;
            case 2:  turbo_mad4_avx2(bits, qk, blocks, bs, a, acc_stride, w + h0, 2, nb); break;
            case 3:  turbo_mad4_avx2(bits, qk, blocks, bs, a, acc_stride, w + h0, 3, nb); break;
            default: turbo_mad4_avx2(bits, qk, blocks, bs, a, acc_stride, w + h0, 4, nb); break;
        }
    }
}

// one copy of the loops per code width and block size, so that every test of bits and qk above folds away (turbo3
// and turbo2 run the same instructions as before turbo4 existed). TURBO_QK_CASES(f, bits, args): f for qk 128 or 64.
#define TURBO_QK_CASES(f, bits, ...) \
    (qk == QK_TURBO_64 ? f(bits, QK_TURBO_64, __VA_ARGS__) : f(bits, QK_TURBO, __VA_ARGS__))

TURBO_AVX2_FN static void turbo_dot_rotated_multi_avx2(int bits, int qk, const uint8_t * blocks, size_t bs,
        const float * q_rot, int64_t q_stride, int nq, float * out, int64_t nb) {
    switch (bits) {
        case 4:  TURBO_QK_CASES(turbo_dot_multi_avx2_bits, 4, blocks, bs, q_rot, q_stride, nq, out, nb); break;
        case 3:  TURBO_QK_CASES(turbo_dot_multi_avx2_bits, 3, blocks, bs, q_rot, q_stride, nq, out, nb); break;
        default: TURBO_QK_CASES(turbo_dot_multi_avx2_bits, 2, blocks, bs, q_rot, q_stride, nq, out, nb); break;
    }
}

TURBO_AVX2_FN static void turbo_mad_rotated_multi_avx2(int bits, int qk, const uint8_t * blocks, size_t bs,
        float * acc_rot, int64_t acc_stride, const float * w, int nq, int64_t nb) {
    switch (bits) {
        case 4:  TURBO_QK_CASES(turbo_mad_multi_avx2_bits, 4, blocks, bs, acc_rot, acc_stride, w, nq, nb); break;
        case 3:  TURBO_QK_CASES(turbo_mad_multi_avx2_bits, 3, blocks, bs, acc_rot, acc_stride, w, nq, nb); break;
        default: TURBO_QK_CASES(turbo_mad_multi_avx2_bits, 2, blocks, bs, acc_rot, acc_stride, w, nq, nb); break;
    }
}
#endif

// The plain C loops: value i of a block in order, each code read once for all nq heads
static void turbo_dot_rotated_multi(int bits, int qk, const uint8_t * blocks, const float * q_rot, int64_t q_stride,
        int nq, float * out, int64_t nb) {
    const size_t bs = turbo_block_bytes(bits, qk);
#ifdef TURBO_AVX2
    if (turbo_use_avx2()) {
        turbo_dot_rotated_multi_avx2(bits, qk, blocks, bs, q_rot, q_stride, nq, out, nb);
        return;
    }
#endif
    const float * cent = turbo_centroids(bits, qk);
    for (int h = 0; h < nq; h++) {
        out[h] = 0.0f;
    }
    for (int64_t ib = 0; ib < nb; ib++) {
        const uint8_t * b = blocks + ib*bs;
        float acc[TURBO_MAX_GQA] = {0};
        for (int i = 0; i < qk; i++) {
            const float c = cent[turbo_code(bits, qk, b + 2, i)];
            for (int h = 0; h < nq; h++) {
                acc[h] += q_rot[h*q_stride + ib*qk + i] * c;
            }
        }
        const float norm = turbo_block_norm(b);
        for (int h = 0; h < nq; h++) {
            out[h] += acc[h] * norm;
        }
    }
}

static void turbo_mad_rotated_multi(int bits, int qk, const uint8_t * blocks, float * acc_rot, int64_t acc_stride,
        const float * w, int nq, int64_t nb) {
    const size_t bs = turbo_block_bytes(bits, qk);
#ifdef TURBO_AVX2
    if (turbo_use_avx2()) {
        turbo_mad_rotated_multi_avx2(bits, qk, blocks, bs, acc_rot, acc_stride, w, nq, nb);
        return;
    }
#endif
    const float * cent = turbo_centroids(bits, qk);
    for (int64_t ib = 0; ib < nb; ib++) {
        const uint8_t * b = blocks + ib*bs;
        const float norm = turbo_block_norm(b);
        float s[TURBO_MAX_GQA];
        for (int h = 0; h < nq; h++) {
            s[h] = w[h] * norm;
        }
        for (int i = 0; i < qk; i++) {
            const float c = cent[turbo_code(bits, qk, b + 2, i)];
            for (int h = 0; h < nq; h++) {
                acc_rot[h*acc_stride + ib*qk + i] += s[h] * c;
            }
        }
    }
}

float turbo3_dot_rotated(const block_turbo3 * x, const float * q_rot, int64_t k) {
    float out;
    turbo_dot_rotated_multi(3, QK_TURBO, (const uint8_t *) x, q_rot, 0, 1, &out, k / QK_TURBO);
    return out;
}

float turbo2_dot_rotated(const block_turbo2 * x, const float * q_rot, int64_t k) {
    float out;
    turbo_dot_rotated_multi(2, QK_TURBO, (const uint8_t *) x, q_rot, 0, 1, &out, k / QK_TURBO);
    return out;
}

float turbo4_dot_rotated(const block_turbo4 * x, const float * q_rot, int64_t k) {
    float out;
    turbo_dot_rotated_multi(4, QK_TURBO, (const uint8_t *) x, q_rot, 0, 1, &out, k / QK_TURBO);
    return out;
}

void turbo3_mad_rotated(const block_turbo3 * x, float * acc_rot, float w, int64_t k) {
    turbo_mad_rotated_multi(3, QK_TURBO, (const uint8_t *) x, acc_rot, 0, &w, 1, k / QK_TURBO);
}

void turbo2_mad_rotated(const block_turbo2 * x, float * acc_rot, float w, int64_t k) {
    turbo_mad_rotated_multi(2, QK_TURBO, (const uint8_t *) x, acc_rot, 0, &w, 1, k / QK_TURBO);
}

void turbo4_mad_rotated(const block_turbo4 * x, float * acc_rot, float w, int64_t k) {
    turbo_mad_rotated_multi(4, QK_TURBO, (const uint8_t *) x, acc_rot, 0, &w, 1, k / QK_TURBO);
}

void turbo_dot_rotated_gqa_qk(int bits, int qk, const void * x, const float * q_rot, int64_t q_stride, int nq,
        float * out, int64_t k) {
    assert(nq >= 1 && nq <= TURBO_MAX_GQA && (bits == 4 || bits == 3 || bits == 2));
    assert(qk == QK_TURBO || qk == QK_TURBO_64);
    turbo_dot_rotated_multi(bits, qk, (const uint8_t *) x, q_rot, q_stride, nq, out, k / qk);
}

void turbo_mad_rotated_gqa_qk(int bits, int qk, const void * x, float * acc_rot, int64_t acc_stride, const float * w,
        int nq, int64_t k) {
    assert(nq >= 1 && nq <= TURBO_MAX_GQA && (bits == 4 || bits == 3 || bits == 2));
    assert(qk == QK_TURBO || qk == QK_TURBO_64);
    turbo_mad_rotated_multi(bits, qk, (const uint8_t *) x, acc_rot, acc_stride, w, nq, k / qk);
}

void turbo_dot_rotated_gqa(int bits, const void * x, const float * q_rot, int64_t q_stride, int nq, float * out, int64_t k) {
    turbo_dot_rotated_gqa_qk(bits, QK_TURBO, x, q_rot, q_stride, nq, out, k);
}

void turbo_mad_rotated_gqa(int bits, const void * x, float * acc_rot, int64_t acc_stride, const float * w, int nq, int64_t k) {
    turbo_mad_rotated_gqa_qk(bits, QK_TURBO, x, acc_rot, acc_stride, w, nq, k);
}

// ---- ggml vec_dot -------------------------------------------------------------------------

// s = <x (a row of n values in blocks of qk), y (f32)>: y rotated block by block, dotted with the codes
static float turbo_vec_dot(int bits, int qk, int n, const void * vx, const float * y) {
    const uint8_t * x = (const uint8_t *) vx;
    const size_t bs = turbo_block_bytes(bits, qk);
    float q[QK_TURBO];
    float sum = 0.0f;
    for (int ib = 0; ib < n / qk; ib++) {
        float d;
        memcpy(q, y + ib*qk, qk * sizeof(float));
        turbo_rotate_forward_qk(q, qk, qk);
        turbo_dot_rotated_multi(bits, qk, x + ib*bs, q, 0, 1, &d, 1);
        sum += d;
    }
    return sum;
}

#define TURBO_VEC_DOT(name, bits, qk)                                                                          \
    void name(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc) {  \
        (void) bs; (void) bx; (void) by; (void) nrc;                                                            \
        *s = turbo_vec_dot(bits, qk, n, vx, (const float *) vy);                                                \
    }
TURBO_VEC_DOT(ggml_vec_dot_turbo4_f32, 4, QK_TURBO)
TURBO_VEC_DOT(ggml_vec_dot_turbo3_f32, 3, QK_TURBO)
TURBO_VEC_DOT(ggml_vec_dot_turbo2_f32, 2, QK_TURBO)
TURBO_VEC_DOT(ggml_vec_dot_turbo4_64_f32, 4, QK_TURBO_64)
TURBO_VEC_DOT(ggml_vec_dot_turbo3_64_f32, 3, QK_TURBO_64)
TURBO_VEC_DOT(ggml_vec_dot_turbo2_64_f32, 2, QK_TURBO_64)
