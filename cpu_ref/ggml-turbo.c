// turbo4 / turbo3 / turbo2 reference implementation. The format is described in ggml-turbo.h.
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

// In-place unnormalized Walsh-Hadamard transform of 128 values, butterflies of span 1, 2, ..., 64.
static void turbo_fwht(float * t) {
    for (int h = 1; h < QK_TURBO; h *= 2) {
        for (int i = 0; i < QK_TURBO; i += 2*h) {
            for (int j = i; j < i + h; j++) {
                const float a = t[j];
                const float b = t[j + h];
                t[j]     = a + b;
                t[j + h] = a - b;
            }
        }
    }
}

static inline void turbo_apply_signs(float * t) {
    for (int i = 0; i < QK_TURBO; i++) {
        if (turbo_sign_negative(i)) {
            t[i] = -t[i];
        }
    }
}

void turbo_rotate_forward(float * x, int64_t k) {
    for (int64_t ib = 0; ib < k / QK_TURBO; ib++) {
        float * t = x + ib*QK_TURBO;
        turbo_apply_signs(t);
        turbo_fwht(t);
        for (int i = 0; i < QK_TURBO; i++) {
            t[i] = t[i] * TURBO_INV_SQRT_QK;
        }
    }
}

void turbo_rotate_inverse(float * x, int64_t k) {
    for (int64_t ib = 0; ib < k / QK_TURBO; ib++) {
        float * t = x + ib*QK_TURBO;
        turbo_fwht(t);
        for (int i = 0; i < QK_TURBO; i++) {
            t[i] = t[i] * TURBO_INV_SQRT_QK;
        }
        turbo_apply_signs(t);
    }
}

// ---- encoder ------------------------------------------------------------------------------

// Sum of 128 values by a pairwise tree: s[i] += s[i + h] for h = 64, 32, ..., 1. Destroys s.
static float turbo_tree_sum(float * s) {
    for (int h = QK_TURBO/2; h >= 1; h /= 2) {
        for (int i = 0; i < h; i++) {
            s[i] = s[i] + s[i + h];
        }
    }
    return s[0];
}

// Encodes one block into codes[128] and returns the FP16 norm (0 for the zero block).
static uint16_t turbo_encode_block(const float * x, uint8_t * codes,
                                   const float * centroids, const float * boundaries, int n_boundaries) {
    float t[QK_TURBO];
    float amax = 0.0f;
    for (int i = 0; i < QK_TURBO; i++) {
        if (!isfinite(x[i])) {
            memset(codes, 0, QK_TURBO);
            return 0;
        }
        const float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    if (amax == 0.0f) {
        memset(codes, 0, QK_TURBO);
        return 0;
    }
    // Huge blocks are scaled by a power of two (exact) so that the sum of squares stays finite.
    int e = 0;
    float pre = 1.0f;
    if (amax > TURBO_BIG_AMAX) {
        frexpf(amax, &e);
        pre = ldexpf(1.0f, -e);
    }
    for (int i = 0; i < QK_TURBO; i++) {
        t[i] = x[i] * pre;
    }
    turbo_apply_signs(t);
    turbo_fwht(t);

    float s[QK_TURBO];
    for (int i = 0; i < QK_TURBO; i++) {
        s[i] = t[i] * t[i];
    }
    const float len = sqrtf(turbo_tree_sum(s));   // |t| = sqrt(128) |x| (times pre)
    if (!(len > 0.0f)) {                          // squares underflowed: below FP16 range anyway
        memset(codes, 0, QK_TURBO);
        return 0;
    }
    const float inv = 1.0f / len;
    for (int i = 0; i < QK_TURBO; i++) {
        const float y = t[i] * inv;
        int c = 0;
        for (int b = 0; b < n_boundaries; b++) {
            c += y > boundaries[b];
        }
        codes[i] = (uint8_t) c;
        s[i] = centroids[c] * centroids[c];
    }
    const float clen = sqrtf(turbo_tree_sum(s));  // |c|, never 0: no centroid is 0
    float norm = (len * TURBO_INV_SQRT_QK) / clen;
    if (e != 0) {
        norm = ldexpf(norm, e);
    }
    if (!(norm <= TURBO_FP16_MAX)) {
        norm = TURBO_FP16_MAX;                    // saturate: a norm is never Inf
    }
    const uint16_t h = turbo_fp32_to_fp16(norm);
    if (h == 0) {
        memset(codes, 0, QK_TURBO);
    }
    return h;
}

static void turbo_pack_low(const uint8_t * codes, uint8_t * qs) {
    for (int j = 0; j < QK_TURBO/4; j++) {
        qs[j] = (uint8_t) ((codes[4*j] & 3) | ((codes[4*j+1] & 3) << 2) |
                           ((codes[4*j+2] & 3) << 4) | ((codes[4*j+3] & 3) << 6));
    }
}

static void turbo_pack_high(const uint8_t * codes, uint8_t * qh) {
    for (int j = 0; j < QK_TURBO/8; j++) {
        uint8_t b = 0;
        for (int l = 0; l < 8; l++) {
            b |= (uint8_t) (((codes[8*j + l] >> 2) & 1) << l);
        }
        qh[j] = b;
    }
}

// turbo4: one nibble per code, code i in byte i/2 (even i in the low nibble)
static void turbo_pack_nibbles(const uint8_t * codes, uint8_t * qs) {
    for (int j = 0; j < QK_TURBO/2; j++) {
        qs[j] = (uint8_t) ((codes[2*j] & 15) | ((codes[2*j+1] & 15) << 4));
    }
}

void quantize_row_turbo4_ref(const float * x, block_turbo4 * y, int64_t k) {
    uint8_t codes[QK_TURBO];
    for (int64_t ib = 0; ib < k / QK_TURBO; ib++) {
        y[ib].norm = turbo_encode_block(x + ib*QK_TURBO, codes, turbo4_centroids, turbo4_boundaries, 15);
        turbo_pack_nibbles(codes, y[ib].qs);
    }
}

void quantize_row_turbo3_ref(const float * x, block_turbo3 * y, int64_t k) {
    uint8_t codes[QK_TURBO];
    for (int64_t ib = 0; ib < k / QK_TURBO; ib++) {
        y[ib].norm = turbo_encode_block(x + ib*QK_TURBO, codes, turbo3_centroids, turbo3_boundaries, 7);
        turbo_pack_low(codes, y[ib].qs);
        turbo_pack_high(codes, y[ib].qs + QK_TURBO/4);
    }
}

void quantize_row_turbo2_ref(const float * x, block_turbo2 * y, int64_t k) {
    uint8_t codes[QK_TURBO];
    for (int64_t ib = 0; ib < k / QK_TURBO; ib++) {
        y[ib].norm = turbo_encode_block(x + ib*QK_TURBO, codes, turbo2_centroids, turbo2_boundaries, 3);
        turbo_pack_low(codes, y[ib].qs);
    }
}

size_t quantize_turbo3(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix) {
    (void) imatrix;
    const size_t row_size = (size_t) (n_per_row / QK_TURBO) * sizeof(block_turbo3);
    for (int64_t r = 0; r < nrows; r++) {
        quantize_row_turbo3_ref(src + r*n_per_row, (block_turbo3 *) ((char *) dst + r*row_size), n_per_row);
    }
    return (size_t) nrows * row_size;
}

size_t quantize_turbo2(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix) {
    (void) imatrix;
    const size_t row_size = (size_t) (n_per_row / QK_TURBO) * sizeof(block_turbo2);
    for (int64_t r = 0; r < nrows; r++) {
        quantize_row_turbo2_ref(src + r*n_per_row, (block_turbo2 * ) ((char *) dst + r*row_size), n_per_row);
    }
    return (size_t) nrows * row_size;
}

size_t quantize_turbo4(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix) {
    (void) imatrix;
    const size_t row_size = (size_t) (n_per_row / QK_TURBO) * sizeof(block_turbo4);
    for (int64_t r = 0; r < nrows; r++) {
        quantize_row_turbo4_ref(src + r*n_per_row, (block_turbo4 *) ((char *) dst + r*row_size), n_per_row);
    }
    return (size_t) nrows * row_size;
}

// ---- decoder ------------------------------------------------------------------------------

static inline int turbo3_code(const uint8_t * qs, int i) {
    return ((qs[i >> 2] >> (2*(i & 3))) & 3) | (((qs[QK_TURBO/4 + (i >> 3)] >> (i & 7)) & 1) << 2);
}

static inline int turbo2_code(const uint8_t * qs, int i) {
    return (qs[i >> 2] >> (2*(i & 3))) & 3;
}

static inline int turbo4_code(const uint8_t * qs, int i) {
    return (qs[i >> 1] >> (4*(i & 1))) & 15;
}

// code i of a block's qs for a type of the given bits (4, 3 or 2)
static inline int turbo_code(int bits, const uint8_t * qs, int i) {
    return bits == 3 ? turbo3_code(qs, i) : bits == 4 ? turbo4_code(qs, i) : turbo2_code(qs, i);
}

static inline const float * turbo_centroids(int bits) {
    return bits == 3 ? turbo3_centroids : bits == 4 ? turbo4_centroids : turbo2_centroids;
}

// c vector of one block in the rotated domain, times scale.
static void turbo3_centroid_vector(const block_turbo3 * b, float scale, float * v) {
    for (int i = 0; i < QK_TURBO; i++) {
        v[i] = turbo3_centroids[turbo3_code(b->qs, i)] * scale;
    }
}

static void turbo2_centroid_vector(const block_turbo2 * b, float scale, float * v) {
    for (int i = 0; i < QK_TURBO; i++) {
        v[i] = turbo2_centroids[turbo2_code(b->qs, i)] * scale;
    }
}

static void turbo4_centroid_vector(const block_turbo4 * b, float scale, float * v) {
    for (int i = 0; i < QK_TURBO; i++) {
        v[i] = turbo4_centroids[turbo4_code(b->qs, i)] * scale;
    }
}

static void turbo_unrotate_block(float * t) {
    turbo_fwht(t);
    turbo_apply_signs(t);
}

void dequantize_row_turbo3(const block_turbo3 * x, float * y, int64_t k) {
    for (int64_t ib = 0; ib < k / QK_TURBO; ib++) {
        const float scale = turbo_fp16_to_fp32(x[ib].norm) * TURBO_INV_SQRT_QK;
        turbo3_centroid_vector(&x[ib], scale, y + ib*QK_TURBO);
        turbo_unrotate_block(y + ib*QK_TURBO);
    }
}

void dequantize_row_turbo2(const block_turbo2 * x, float * y, int64_t k) {
    for (int64_t ib = 0; ib < k / QK_TURBO; ib++) {
        const float scale = turbo_fp16_to_fp32(x[ib].norm) * TURBO_INV_SQRT_QK;
        turbo2_centroid_vector(&x[ib], scale, y + ib*QK_TURBO);
        turbo_unrotate_block(y + ib*QK_TURBO);
    }
}

void dequantize_row_turbo4(const block_turbo4 * x, float * y, int64_t k) {
    for (int64_t ib = 0; ib < k / QK_TURBO; ib++) {
        const float scale = turbo_fp16_to_fp32(x[ib].norm) * TURBO_INV_SQRT_QK;
        turbo4_centroid_vector(&x[ib], scale, y + ib*QK_TURBO);
        turbo_unrotate_block(y + ib*QK_TURBO);
    }
}

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

TURBO_AVX2_FN static inline __m256i turbo3_codes8(const uint8_t * qs, int j) {
    const __m256i bit = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i hi  = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(qs[QK_TURBO/4 + j]), bit), _mm256_set1_epi32(1));
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
TURBO_AVX2_FN static inline __m256 turbo_table8(int bits) {
    return bits == 3 ? _mm256_loadu_ps(turbo3_centroids)
         : bits == 4 ? _mm256_loadu_ps(turbo4_centroids)
                     : _mm256_setr_ps(turbo2_centroids[0], turbo2_centroids[1], turbo2_centroids[2], turbo2_centroids[3],
                                      turbo2_centroids[0], turbo2_centroids[1], turbo2_centroids[2], turbo2_centroids[3]);
}

// the centroids of codes 8-15 (turbo4 only; never looked up for the other types)
TURBO_AVX2_FN static inline __m256 turbo_table8_hi(int bits) {
    return bits == 4 ? _mm256_loadu_ps(turbo4_centroids + 8) : _mm256_setzero_ps();
}

TURBO_AVX2_FN static inline __m256i turbo_codes8(int bits, const uint8_t * qs, int j) {
    return bits == 3 ? turbo3_codes8(qs, j) : bits == 4 ? turbo4_codes8(qs, j) : turbo_low_codes8(qs, j);
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
TURBO_AVX2_FN static inline __attribute__((always_inline)) void turbo_dot4_avx2(int bits, const uint8_t * blocks, size_t bs,
        const float * q_rot, int64_t q_stride, const int n, float * out, int64_t nb) {
    const __m256 table = turbo_table8(bits);
    const __m256 table_hi = turbo_table8_hi(bits);
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t ib = 0; ib < nb; ib++) {
        const uint8_t * b = blocks + ib*bs;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int j = 0; j < QK_TURBO/8; j++) {
            const __m256 c = turbo_lookup8(bits, table, table_hi, turbo_codes8(bits, b + 2, j));
            for (int h = 0; h < n; h++) {
                acc[h] = _mm256_fmadd_ps(c, _mm256_loadu_ps(q_rot + h*q_stride + ib*QK_TURBO + 8*j), acc[h]);
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

TURBO_AVX2_FN static inline __attribute__((always_inline)) void turbo_dot_multi_avx2_bits(int bits, const uint8_t * blocks,
        size_t bs, const float * q_rot, int64_t q_stride, int nq, float * out, int64_t nb) {
    for (int h0 = 0; h0 < nq; h0 += 4) {
        const float * q = q_rot + h0*q_stride;
        switch (nq - h0) {
            case 1:  turbo_dot4_avx2(bits, blocks, bs, q, q_stride, 1, out + h0, nb); break;
            case 2:  turbo_dot4_avx2(bits, blocks, bs, q, q_stride, 2, out + h0, nb); break;
            case 3:  turbo_dot4_avx2(bits, blocks, bs, q, q_stride, 3, out + h0, nb); break;
            default: turbo_dot4_avx2(bits, blocks, bs, q, q_stride, 4, out + h0, nb); break;
        }
    }
}

TURBO_AVX2_FN static inline __attribute__((always_inline)) void turbo_mad4_avx2(int bits, const uint8_t * blocks, size_t bs,
        float * acc_rot, int64_t acc_stride, const float * w, const int n, int64_t nb) {
    for (int64_t ib = 0; ib < nb; ib++) {
        const uint8_t * b = blocks + ib*bs;
        const float norm = turbo_block_norm(b);
        __m256 table[4], table_hi[4];
        for (int h = 0; h < n; h++) {
            table[h]    = _mm256_mul_ps(turbo_table8(bits), _mm256_set1_ps(w[h] * norm));
            table_hi[h] = _mm256_mul_ps(turbo_table8_hi(bits), _mm256_set1_ps(w[h] * norm));
        }
        for (int j = 0; j < QK_TURBO/8; j++) {
            const __m256i codes = turbo_codes8(bits, b + 2, j);
            for (int h = 0; h < n; h++) {
                float * a = acc_rot + h*acc_stride + ib*QK_TURBO + 8*j;
                _mm256_storeu_ps(a, _mm256_add_ps(_mm256_loadu_ps(a), turbo_lookup8(bits, table[h], table_hi[h], codes)));
            }
        }
    }
}

TURBO_AVX2_FN static inline __attribute__((always_inline)) void turbo_mad_multi_avx2_bits(int bits, const uint8_t * blocks,
        size_t bs, float * acc_rot, int64_t acc_stride, const float * w, int nq, int64_t nb) {
    for (int h0 = 0; h0 < nq; h0 += 4) {
        float * a = acc_rot + h0*acc_stride;
        switch (nq - h0) {
            case 1:  turbo_mad4_avx2(bits, blocks, bs, a, acc_stride, w + h0, 1, nb); break;
            case 2:  turbo_mad4_avx2(bits, blocks, bs, a, acc_stride, w + h0, 2, nb); break;
            case 3:  turbo_mad4_avx2(bits, blocks, bs, a, acc_stride, w + h0, 3, nb); break;
            default: turbo_mad4_avx2(bits, blocks, bs, a, acc_stride, w + h0, 4, nb); break;
        }
    }
}

// one copy of the loops per code width, so that every test of bits above folds away (turbo3 and turbo2 run the
// same instructions as before turbo4 existed)
TURBO_AVX2_FN static void turbo_dot_rotated_multi_avx2(int bits, const uint8_t * blocks, size_t bs, const float * q_rot,
        int64_t q_stride, int nq, float * out, int64_t nb) {
    switch (bits) {
        case 4:  turbo_dot_multi_avx2_bits(4, blocks, bs, q_rot, q_stride, nq, out, nb); break;
        case 3:  turbo_dot_multi_avx2_bits(3, blocks, bs, q_rot, q_stride, nq, out, nb); break;
        default: turbo_dot_multi_avx2_bits(2, blocks, bs, q_rot, q_stride, nq, out, nb); break;
    }
}

TURBO_AVX2_FN static void turbo_mad_rotated_multi_avx2(int bits, const uint8_t * blocks, size_t bs, float * acc_rot,
        int64_t acc_stride, const float * w, int nq, int64_t nb) {
    switch (bits) {
        case 4:  turbo_mad_multi_avx2_bits(4, blocks, bs, acc_rot, acc_stride, w, nq, nb); break;
        case 3:  turbo_mad_multi_avx2_bits(3, blocks, bs, acc_rot, acc_stride, w, nq, nb); break;
        default: turbo_mad_multi_avx2_bits(2, blocks, bs, acc_rot, acc_stride, w, nq, nb); break;
    }
}
#endif

// The plain C loops: value i of a block in order, each code read once for all nq heads
static void turbo_dot_rotated_multi(int bits, const uint8_t * blocks, size_t bs, const float * q_rot, int64_t q_stride,
        int nq, float * out, int64_t nb) {
#ifdef TURBO_AVX2
    if (turbo_use_avx2()) {
        turbo_dot_rotated_multi_avx2(bits, blocks, bs, q_rot, q_stride, nq, out, nb);
        return;
    }
#endif
    const float * cent = turbo_centroids(bits);
    for (int h = 0; h < nq; h++) {
        out[h] = 0.0f;
    }
    for (int64_t ib = 0; ib < nb; ib++) {
        const uint8_t * b = blocks + ib*bs;
        float acc[TURBO_MAX_GQA] = {0};
        for (int i = 0; i < QK_TURBO; i++) {
            const float c = cent[turbo_code(bits, b + 2, i)];
            for (int h = 0; h < nq; h++) {
                acc[h] += q_rot[h*q_stride + ib*QK_TURBO + i] * c;
            }
        }
        const float norm = turbo_block_norm(b);
        for (int h = 0; h < nq; h++) {
            out[h] += acc[h] * norm;
        }
    }
}

static void turbo_mad_rotated_multi(int bits, const uint8_t * blocks, size_t bs, float * acc_rot, int64_t acc_stride,
        const float * w, int nq, int64_t nb) {
#ifdef TURBO_AVX2
    if (turbo_use_avx2()) {
        turbo_mad_rotated_multi_avx2(bits, blocks, bs, acc_rot, acc_stride, w, nq, nb);
        return;
    }
#endif
    const float * cent = turbo_centroids(bits);
    for (int64_t ib = 0; ib < nb; ib++) {
        const uint8_t * b = blocks + ib*bs;
        const float norm = turbo_block_norm(b);
        float s[TURBO_MAX_GQA];
        for (int h = 0; h < nq; h++) {
            s[h] = w[h] * norm;
        }
        for (int i = 0; i < QK_TURBO; i++) {
            const float c = cent[turbo_code(bits, b + 2, i)];
            for (int h = 0; h < nq; h++) {
                acc_rot[h*acc_stride + ib*QK_TURBO + i] += s[h] * c;
            }
        }
    }
}

// one head
static float turbo_dot_rotated(int bits, const uint8_t * blocks, size_t bs, const float * q_rot, int64_t nb) {
    float out;
    turbo_dot_rotated_multi(bits, blocks, bs, q_rot, 0, 1, &out, nb);
    return out;
}

static void turbo_mad_rotated(int bits, const uint8_t * blocks, size_t bs, float * acc_rot, float w, int64_t nb) {
    turbo_mad_rotated_multi(bits, blocks, bs, acc_rot, 0, &w, 1, nb);
}

float turbo3_dot_rotated(const block_turbo3 * x, const float * q_rot, int64_t k) {
    return turbo_dot_rotated(3, (const uint8_t *) x, sizeof(block_turbo3), q_rot, k / QK_TURBO);
}

float turbo2_dot_rotated(const block_turbo2 * x, const float * q_rot, int64_t k) {
    return turbo_dot_rotated(2, (const uint8_t *) x, sizeof(block_turbo2), q_rot, k / QK_TURBO);
}

float turbo4_dot_rotated(const block_turbo4 * x, const float * q_rot, int64_t k) {
    return turbo_dot_rotated(4, (const uint8_t *) x, sizeof(block_turbo4), q_rot, k / QK_TURBO);
}

void turbo3_mad_rotated(const block_turbo3 * x, float * acc_rot, float w, int64_t k) {
    turbo_mad_rotated(3, (const uint8_t *) x, sizeof(block_turbo3), acc_rot, w, k / QK_TURBO);
}

void turbo2_mad_rotated(const block_turbo2 * x, float * acc_rot, float w, int64_t k) {
    turbo_mad_rotated(2, (const uint8_t *) x, sizeof(block_turbo2), acc_rot, w, k / QK_TURBO);
}

void turbo4_mad_rotated(const block_turbo4 * x, float * acc_rot, float w, int64_t k) {
    turbo_mad_rotated(4, (const uint8_t *) x, sizeof(block_turbo4), acc_rot, w, k / QK_TURBO);
}

void turbo_dot_rotated_gqa(int bits, const void * x, const float * q_rot, int64_t q_stride, int nq, float * out, int64_t k) {
    assert(nq >= 1 && nq <= TURBO_MAX_GQA && (bits == 4 || bits == 3 || bits == 2));
    if (bits == 3) {
        turbo_dot_rotated_multi(3, (const uint8_t *) x, sizeof(block_turbo3), q_rot, q_stride, nq, out, k / QK_TURBO);
    } else if (bits == 4) {
        turbo_dot_rotated_multi(4, (const uint8_t *) x, sizeof(block_turbo4), q_rot, q_stride, nq, out, k / QK_TURBO);
    } else {
        turbo_dot_rotated_multi(2, (const uint8_t *) x, sizeof(block_turbo2), q_rot, q_stride, nq, out, k / QK_TURBO);
    }
}

void turbo_mad_rotated_gqa(int bits, const void * x, float * acc_rot, int64_t acc_stride, const float * w, int nq, int64_t k) {
    assert(nq >= 1 && nq <= TURBO_MAX_GQA && (bits == 4 || bits == 3 || bits == 2));
    if (bits == 3) {
        turbo_mad_rotated_multi(3, (const uint8_t *) x, sizeof(block_turbo3), acc_rot, acc_stride, w, nq, k / QK_TURBO);
    } else if (bits == 4) {
        turbo_mad_rotated_multi(4, (const uint8_t *) x, sizeof(block_turbo4), acc_rot, acc_stride, w, nq, k / QK_TURBO);
    } else {
        turbo_mad_rotated_multi(2, (const uint8_t *) x, sizeof(block_turbo2), acc_rot, acc_stride, w, nq, k / QK_TURBO);
    }
}

// ---- ggml vec_dot -------------------------------------------------------------------------

void ggml_vec_dot_turbo3_f32(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc) {
    (void) bs; (void) bx; (void) by; (void) nrc;
    const block_turbo3 * x = (const block_turbo3 *) vx;
    const float * y = (const float *) vy;
    float q[QK_TURBO];
    float sum = 0.0f;
    for (int ib = 0; ib < n / QK_TURBO; ib++) {
        memcpy(q, y + ib*QK_TURBO, sizeof(q));
        turbo_rotate_forward(q, QK_TURBO);
        sum += turbo3_dot_rotated(x + ib, q, QK_TURBO);
    }
    *s = sum;
}

void ggml_vec_dot_turbo2_f32(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc) {
    (void) bs; (void) bx; (void) by; (void) nrc;
    const block_turbo2 * x = (const block_turbo2 *) vx;
    const float * y = (const float *) vy;
    float q[QK_TURBO];
    float sum = 0.0f;
    for (int ib = 0; ib < n / QK_TURBO; ib++) {
        memcpy(q, y + ib*QK_TURBO, sizeof(q));
        turbo_rotate_forward(q, QK_TURBO);
        sum += turbo2_dot_rotated(x + ib, q, QK_TURBO);
    }
    *s = sum;
}

void ggml_vec_dot_turbo4_f32(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc) {
    (void) bs; (void) bx; (void) by; (void) nrc;
    const block_turbo4 * x = (const block_turbo4 *) vx;
    const float * y = (const float *) vy;
    float q[QK_TURBO];
    float sum = 0.0f;
    for (int ib = 0; ib < n / QK_TURBO; ib++) {
        memcpy(q, y + ib*QK_TURBO, sizeof(q));
        turbo_rotate_forward(q, QK_TURBO);
        sum += turbo4_dot_rotated(x + ib, q, QK_TURBO);
    }
    *s = sum;
}
