// turbo4 / turbo3 / turbo2: TurboQuant KV-cache block formats (random rotation + Lloyd-Max codebook).
//
// One block holds QK_TURBO = 128 values x:
//   t    = FWHT(D x)                 D: fixed random signs (turbo-codebooks.h), FWHT unnormalized
//   y    = t / |t|                   a point on the unit sphere, coordinates ~ Beta-like, var 1/128
//   code = nearest Lloyd-Max centroid index of each y_i (4, 3 or 2 bits)
//   norm = |x| / |c|                 c = chosen centroids; so that the decoded block keeps |x|
// Decode: x^ = norm * D H c, with H the orthonormal Walsh-Hadamard matrix (H = H^T = H^-1).
//
// Code layout in qs (turbo3 and turbo2 share the low plane, turbo2 has no high plane):
//   low plane  qs[0..31]:  bits 0-1 of code i at byte i/4, shift 2*(i%4)
//   high plane qs[32..47]: bit 2 of code i at byte 32 + i/8, bit i%8          (turbo3 only)
// turbo4 stores one nibble per code: code i at byte i/2, shift 4*(i%2) (bits 0-3).
//
// A block whose input has a NaN or Inf, or whose norm is zero or underflows, is the zero block
// (norm 0, codes 0) and decodes to exact zeros. A stored norm above the FP16 range saturates at 65504.
//
// Invalid blocks: a stored norm that is NaN, Inf or has its sign bit set (-0 included) is never written
// by the encoder. ggml_validate_row_data rejects a row holding one (turbo*_validate_row below); the Python
// bindings' dequantize raises ValueError naming the first such block, or decodes it as zeros when asked
// (invalid="zero"). dequantize_row_turbo* and the attention helpers do not check (hot paths): fed such a
// block they give NaN/Inf, so data from outside this encoder must be validated first. Every block with a
// valid norm decodes to finite values, whatever its code bits.
//
// 64-value blocks (the _64 types, for models whose head_dim is a multiple of 64 but not of 128): the same
// format with QK_TURBO_64 = 64 values per block: a 64-point FWHT, the first 64 signs of D, Lloyd-Max codebooks
// for d = 64 (turbo-codebooks-64.h), the same planes at qs[0..15] (low) and qs[16..23] (turbo3's high bit).
// turbo3_64: 26 bytes per 64 values (3.25 bits/value), turbo2_64: 18 (2.25), turbo4_64: 34 (4.25).
//
// This file is plain C with no ggml dependency: it is compiled into ggml (copied into
// ggml/src by turbo-llama prepare) and into the Python extension.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define QK_TURBO 128
#define TURBO3_QS_BYTES (QK_TURBO * 3 / 8)
#define TURBO2_QS_BYTES (QK_TURBO * 2 / 8)
#define TURBO4_QS_BYTES (QK_TURBO * 4 / 8)
#define QK_TURBO_64 64

// The norm is an IEEE binary16 bit pattern (same representation as ggml_half).
typedef struct {
    uint16_t norm;
    uint8_t  qs[TURBO3_QS_BYTES];
} block_turbo3;

typedef struct {
    uint16_t norm;
    uint8_t  qs[TURBO2_QS_BYTES];
} block_turbo2;

typedef struct {
    uint16_t norm;
    uint8_t  qs[TURBO4_QS_BYTES];
} block_turbo4;

typedef struct {
    uint16_t norm;
    uint8_t  qs[QK_TURBO_64 * 3 / 8];
} block_turbo3_64;

typedef struct {
    uint16_t norm;
    uint8_t  qs[QK_TURBO_64 * 2 / 8];
} block_turbo2_64;

typedef struct {
    uint16_t norm;
    uint8_t  qs[QK_TURBO_64 * 4 / 8];
} block_turbo4_64;

#if defined(__cplusplus)
static_assert(sizeof(block_turbo3_64) == 26, "wrong turbo3_64 block size");
static_assert(sizeof(block_turbo2_64) == 18, "wrong turbo2_64 block size");
static_assert(sizeof(block_turbo4_64) == 34, "wrong turbo4_64 block size");
static_assert(sizeof(block_turbo3) == 50, "wrong turbo3 block size");
static_assert(sizeof(block_turbo2) == 34, "wrong turbo2 block size");
static_assert(sizeof(block_turbo4) == 66, "wrong turbo4 block size");
#else
_Static_assert(sizeof(block_turbo3_64) == 26, "wrong turbo3_64 block size");
_Static_assert(sizeof(block_turbo2_64) == 18, "wrong turbo2_64 block size");
_Static_assert(sizeof(block_turbo4_64) == 34, "wrong turbo4_64 block size");
_Static_assert(sizeof(block_turbo3) == 50, "wrong turbo3 block size");
_Static_assert(sizeof(block_turbo2) == 34, "wrong turbo2 block size");
_Static_assert(sizeof(block_turbo4) == 66, "wrong turbo4 block size");
#endif

// IEEE binary16 <-> binary32, round to nearest even (bit-identical to CUDA's __float2half_rn).
uint16_t turbo_fp32_to_fp16(float f);
float    turbo_fp16_to_fp32(uint16_t h);

// Rotation of k values (k a multiple of QK_TURBO), block by block, in place.
// forward: x <- H D x (orthonormal H); inverse: x <- D H x.
void turbo_rotate_forward(float * x, int64_t k);
void turbo_rotate_inverse(float * x, int64_t k);
// the same for blocks of qk values (QK_TURBO or QK_TURBO_64), k a multiple of qk
void turbo_rotate_forward_qk(float * x, int64_t k, int qk);
void turbo_rotate_inverse_qk(float * x, int64_t k, int qk);

// ggml-style row functions (k a multiple of QK_TURBO).
void quantize_row_turbo3_ref(const float * x, block_turbo3 * y, int64_t k);
void quantize_row_turbo2_ref(const float * x, block_turbo2 * y, int64_t k);
void quantize_row_turbo4_ref(const float * x, block_turbo4 * y, int64_t k);
void dequantize_row_turbo3(const block_turbo3 * x, float * y, int64_t k);
void dequantize_row_turbo2(const block_turbo2 * x, float * y, int64_t k);
void dequantize_row_turbo4(const block_turbo4 * x, float * y, int64_t k);
// the 64-value block types (k a multiple of QK_TURBO_64)
void quantize_row_turbo3_64_ref(const float * x, block_turbo3_64 * y, int64_t k);
void quantize_row_turbo2_64_ref(const float * x, block_turbo2_64 * y, int64_t k);
void quantize_row_turbo4_64_ref(const float * x, block_turbo4_64 * y, int64_t k);
void dequantize_row_turbo3_64(const block_turbo3_64 * x, float * y, int64_t k);
void dequantize_row_turbo2_64(const block_turbo2_64 * x, float * y, int64_t k);
void dequantize_row_turbo4_64(const block_turbo4_64 * x, float * y, int64_t k);

// ggml_quantize_chunk entry points (the importance matrix is unused: no calibration).
size_t quantize_turbo3(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix);
size_t quantize_turbo2(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix);
size_t quantize_turbo4(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix);
size_t quantize_turbo3_64(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix);
size_t quantize_turbo2_64(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix);
size_t quantize_turbo4_64(const float * src, void * dst, int64_t nrows, int64_t n_per_row, const float * imatrix);

// Row validation for ggml_validate_row_data: every norm finite and non-negative (see "Invalid blocks").
// turbo_first_invalid_block: the index of the first of nblocks blocks of block_size bytes with an
// invalid norm, or -1 when all are valid.
int64_t turbo_first_invalid_block(const void * data, int64_t nblocks, size_t block_size);
bool turbo3_validate_row(const void * data, size_t nbytes);
bool turbo2_validate_row(const void * data, size_t nbytes);
bool turbo4_validate_row(const void * data, size_t nbytes);
// any type: bits 4, 3 or 2, qk QK_TURBO or QK_TURBO_64
bool turbo_validate_row_qk(int bits, int qk, const void * data, size_t nbytes);

// Fused attention helpers, all in the rotated domain (no inverse transform per block):
//   q_rot = H D q  (turbo_rotate_forward on a copy of q, once per query)
//   dot:  sum over blocks of norm_b * <q_rot_b, c_b>           (= <q, x^>)
//   mad:  acc_rot_b += w * norm_b * c_b                         (turbo_rotate_inverse(acc) at the end)
float turbo3_dot_rotated(const block_turbo3 * x, const float * q_rot, int64_t k);
float turbo2_dot_rotated(const block_turbo2 * x, const float * q_rot, int64_t k);
float turbo4_dot_rotated(const block_turbo4 * x, const float * q_rot, int64_t k);
void  turbo3_mad_rotated(const block_turbo3 * x, float * acc_rot, float w, int64_t k);
void  turbo2_mad_rotated(const block_turbo2 * x, float * acc_rot, float w, int64_t k);
void  turbo4_mad_rotated(const block_turbo4 * x, float * acc_rot, float w, int64_t k);

// The same for the nq (<= TURBO_MAX_GQA) query heads that share one KV head (GQA): each block's codes are read
// once. Head h's q_rot / acc_rot row starts at h*stride; per head the results equal the single-head calls'
// bit for bit. bits: 4 (turbo4), 3 (turbo3) or 2 (turbo2); x: one row of k/128 blocks.
#define TURBO_MAX_GQA 16
void turbo_dot_rotated_gqa(int bits, const void * x, const float * q_rot, int64_t q_stride, int nq, float * out, int64_t k);
void turbo_mad_rotated_gqa(int bits, const void * x, float * acc_rot, int64_t acc_stride, const float * w, int nq, int64_t k);
// the same for blocks of qk values (QK_TURBO or QK_TURBO_64): x one row of k/qk blocks of that type
void turbo_dot_rotated_gqa_qk(int bits, int qk, const void * x, const float * q_rot, int64_t q_stride, int nq,
                              float * out, int64_t k);
void turbo_mad_rotated_gqa_qk(int bits, int qk, const void * x, float * acc_rot, int64_t acc_stride, const float * w,
                              int nq, int64_t k);

// ggml vec_dot signature: s = <x (turbo row), y (f32 row)>; rotates y internally.
void ggml_vec_dot_turbo3_f32(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void ggml_vec_dot_turbo2_f32(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void ggml_vec_dot_turbo4_f32(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void ggml_vec_dot_turbo3_64_f32(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void ggml_vec_dot_turbo2_64_f32(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void ggml_vec_dot_turbo4_64_f32(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);

#ifdef __cplusplus
}
#endif
