// The CUDA names that the encode helpers (cuda/turbo-common.cuh, cuda/turbo-encode-t2.cuh) use, for compiling them as
// host code in the host checks: the device tables from turbo_consts.inc (extracted by the check's script) and the
// explicitly rounded float intrinsics as plain operations (the checks are built with -ffp-contract=off).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include "ggml-turbo.h"

#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define TURBO_CUDA_INV_SQRT_QK 0.0883883476483184405f
#define TURBO_CUDA_FP16_MAX    65504.0f
#define TURBO_CUDA_BIG_AMAX    4294967296.0f
#include "turbo_consts.inc"   // TURBO_CUDA_SIGN_WORDS, _C3, _B3, _C2, _B2, _C4, _B4 (from cuda/turbo-common.cuh)
static const unsigned int turbo_d_sign_words[4] = TURBO_CUDA_SIGN_WORDS;
static const float turbo_d_c3[8] = TURBO_CUDA_C3, turbo_d_b3[7] = TURBO_CUDA_B3;
static const float turbo_d_c2[4] = TURBO_CUDA_C2, turbo_d_b2[3] = TURBO_CUDA_B2;
static const float turbo_d_c4[16] = TURBO_CUDA_C4, turbo_d_b4[15] = TURBO_CUDA_B4;
struct float4 { float x, y, z, w; };
static inline uint32_t __float_as_uint(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline float __uint_as_float(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
static inline bool turbo_is_finite(const float x) { return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u; }
static inline bool turbo_sign_neg(const int i) { return (turbo_d_sign_words[i >> 5] >> (i & 31)) & 1u; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a*b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __fdiv_rn(float a, float b) { return a/b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline uint32_t __funnelshift_r(uint32_t lo, uint32_t hi, int s) { return (uint32_t) ((((uint64_t) hi << 32) | lo) >> s); }
static inline uint16_t __float2half_rn(float x) { return turbo_fp32_to_fp16(x); }   // round to nearest even, as CUDA's
static inline uint16_t __half_as_ushort(uint16_t h) { return h; }
