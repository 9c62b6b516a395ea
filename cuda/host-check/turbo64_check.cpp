// Host check of the 64-value blocks' warp helpers (cuda/turbo-common.cuh): the warp's 32 lanes emulated with 32
// std::threads that meet at a barrier for every shuffle, vote and ballot. Every block is encoded and packed as the
// SET_ROWS (turbo.cu) / CPY kernels do (turbo64_warp_encode + turbo64_warp_store) and compared byte for byte with the C
// reference (quantize_row_turbo*_64_ref, cpu_ref/ggml-turbo.c); decoded as GET_ROWS does (turbo64_warp_decode) and
// compared bit for bit with dequantize_row_turbo*_64; the rotations of cell 0's rows and of the attention
// (turbo64_warp_rotate / _unrotate) with turbo_rotate_forward_qk / turbo_rotate_inverse_qk.
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>
#include "ggml-turbo.h"

#include "cuda_host_shims.h"   // the CUDA names of the encode helpers as host code

// the warp: lane l is a thread, exchanges go through g_xs between two barrier waits
static std::barrier<> * g_bar;
static thread_local int g_lane;
static uint32_t g_xs[32];

static inline uint32_t lane_xchg(const uint32_t v, const int src) {
    g_xs[g_lane] = v;
    g_bar->arrive_and_wait();
    const uint32_t r = g_xs[src & 31];
    g_bar->arrive_and_wait();
    return r;
}
static inline float __shfl_xor_sync(unsigned, const float v, const int h) { return __uint_as_float(lane_xchg(__float_as_uint(v), g_lane ^ h)); }
static inline int   __shfl_xor_sync(unsigned, const int v, const int h)   { return (int) lane_xchg((uint32_t) v, g_lane ^ h); }
static inline float __shfl_sync(unsigned, const float v, const int s)     { return __uint_as_float(lane_xchg(__float_as_uint(v), s)); }
static inline int   __shfl_sync(unsigned, const int v, const int s)       { return (int) lane_xchg((uint32_t) v, s); }
static inline float __shfl_down_sync(unsigned, const float v, const int h) {
    return __uint_as_float(lane_xchg(__float_as_uint(v), g_lane + h < 32 ? g_lane + h : g_lane));
}
static inline uint32_t __ballot_sync(unsigned, const int p) {
    g_xs[g_lane] = p ? 1u : 0u;
    g_bar->arrive_and_wait();
    uint32_t r = 0;
    for (int l = 0; l < 32; ++l) {
        r |= g_xs[l] << l;
    }
    g_bar->arrive_and_wait();
    return r;
}
static inline bool __any_sync(unsigned m, const bool p) { return __ballot_sync(m, p) != 0; }
static inline uint16_t __ushort_as_half(const uint16_t h) { return h; }
static inline float __half2float(const uint16_t h) { return turbo_fp16_to_fp32(h); }

#include "turbo_helpers.inc"    // turbo_prescale (cuda/turbo-common.cuh)
#include "turbo64_consts.inc"   // TURBO64_CUDA_C3, ... (cuda/turbo-common.cuh)
static const float turbo64_d_c3[8] = TURBO64_CUDA_C3, turbo64_d_b3[7] = TURBO64_CUDA_B3;
static const float turbo64_d_c2[4] = TURBO64_CUDA_C2, turbo64_d_b2[3] = TURBO64_CUDA_B2;
static const float turbo64_d_c4[16] = TURBO64_CUDA_C4, turbo64_d_b4[15] = TURBO64_CUDA_B4;
#define TURBO64_INV_SQRT 0.125f
#include "turbo64_helpers.inc"  // the 64-point FWHT and the warp helpers (cuda/turbo-common.cuh)

static const int QK = QK_TURBO_64;

// one warp over nblk blocks of x: encoded + packed into enc (bs bytes each), decoded into dec, x rotated into rot and
// unrotated into unr
template <int bits>
static void run_warp(const std::vector<float> & x, const int nblk, std::vector<uint8_t> & enc, std::vector<float> & dec,
        std::vector<float> & rot, std::vector<float> & unr) {
    const int bs = 2 + QK*bits/8;
    std::barrier<> bar(32);
    g_bar = &bar;
    std::vector<std::thread> th;
    for (int lane = 0; lane < 32; ++lane) {
        th.emplace_back([&, lane] {
            g_lane = lane;
            for (int b = 0; b < nblk; ++b) {
                const float * xb = x.data() + (size_t) b*QK;
                float v[2] = { xb[lane], xb[lane + 32] };
                int codes[2];
                const uint16_t h = turbo64_warp_encode<bits>(v, codes, lane);
                turbo64_warp_store<bits>(enc.data() + (size_t) b*bs, h, codes, lane);
                g_bar->arrive_and_wait();   // the block's bytes are all written before any lane decodes it
                float d[2];
                turbo64_warp_decode<bits>(enc.data() + (size_t) b*bs, d, lane);
                dec[(size_t) b*QK + lane] = d[0];
                dec[(size_t) b*QK + lane + 32] = d[1];
                float r[2] = { xb[lane], xb[lane + 32] };
                turbo64_warp_rotate(r, lane);
                rot[(size_t) b*QK + lane] = r[0];
                rot[(size_t) b*QK + lane + 32] = r[1];
                turbo64_warp_unrotate(r, lane);
                unr[(size_t) b*QK + lane] = r[0];
                unr[(size_t) b*QK + lane + 32] = r[1];
            }
        });
    }
    for (auto & t : th) {
        t.join();
    }
}

template <int bits>
static int check(const std::vector<float> & x, const int nblk) {
    const int bs = 2 + QK*bits/8;
    std::vector<uint8_t> enc((size_t) nblk*bs, 0xAB), ref((size_t) nblk*bs);
    std::vector<float> dec((size_t) nblk*QK), rot(dec.size()), unr(dec.size());
    run_warp<bits>(x, nblk, enc, dec, rot, unr);
    const int64_t k = (int64_t) nblk*QK;
    std::vector<float> ref_dec(dec.size()), ref_rot(x), ref_unr;
    if (bits == 4) { quantize_row_turbo4_64_ref(x.data(), (block_turbo4_64 *) ref.data(), k); dequantize_row_turbo4_64((const block_turbo4_64 *) ref.data(), ref_dec.data(), k); }
    if (bits == 3) { quantize_row_turbo3_64_ref(x.data(), (block_turbo3_64 *) ref.data(), k); dequantize_row_turbo3_64((const block_turbo3_64 *) ref.data(), ref_dec.data(), k); }
    if (bits == 2) { quantize_row_turbo2_64_ref(x.data(), (block_turbo2_64 *) ref.data(), k); dequantize_row_turbo2_64((const block_turbo2_64 *) ref.data(), ref_dec.data(), k); }
    turbo_rotate_forward_qk(ref_rot.data(), k, QK);
    ref_unr = ref_rot;
    turbo_rotate_inverse_qk(ref_unr.data(), k, QK);
    int bad_enc = 0, bad_dec = 0, bad_rot = 0;
    for (int b = 0; b < nblk; ++b) {
        if (memcmp(enc.data() + (size_t) b*bs, ref.data() + (size_t) b*bs, bs) != 0) {
            if (bad_enc++ < 4) {
                printf("  turbo%d_64 block %d: norm %04x, reference %04x\n", bits, b, enc[(size_t) b*bs] | (enc[(size_t) b*bs + 1] << 8),
                       ref[(size_t) b*bs] | (ref[(size_t) b*bs + 1] << 8));
            }
        }
        bad_dec += memcmp(dec.data() + (size_t) b*QK, ref_dec.data() + (size_t) b*QK, QK*sizeof(float)) != 0;
        bad_rot += memcmp(rot.data() + (size_t) b*QK, ref_rot.data() + (size_t) b*QK, QK*sizeof(float)) != 0 ||
                   memcmp(unr.data() + (size_t) b*QK, ref_unr.data() + (size_t) b*QK, QK*sizeof(float)) != 0;
    }
    printf("turbo%d_64: %d of %d blocks differ from quantize_row_turbo%d_64_ref, %d decoded blocks from dequantize_row_turbo%d_64, "
           "%d rotated / unrotated blocks from turbo_rotate_forward_qk / _inverse_qk\n", bits, bad_enc, nblk, bits, bad_dec, bits, bad_rot);
    return bad_enc + bad_dec + bad_rot;
}

int main() {
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int nblk = 120;
    std::vector<float> x((size_t) nblk*QK);
    for (int b = 0; b < nblk; ++b) {
        float * xb = x.data() + (size_t) b*QK;
        for (int i = 0; i < QK; ++i) xb[i] = nd(rng);
        switch (b % 12) {   // special blocks among the Gaussian ones
            case 1: for (int i = 0; i < QK; ++i) xb[i] = 0.0f; break;                    // zero
            case 2: for (int i = 0; i < QK; ++i) xb[i] *= 1e-30f; break;                 // squares underflow: zero block
            case 3: for (int i = 0; i < QK; ++i) xb[i] *= 3e37f; break;                  // pre-scaled, saturated norm
            case 4: xb[17] = NAN; break;                                                 // zero block
            case 5: xb[40] = -INFINITY; break;
            case 6: xb[3] = 1e6f; xb[50] = -5e9f; break;                                 // one value above 2^32
            case 7: for (int i = 0; i < QK; ++i) xb[i] *= 1e-6f; break;                  // norm in FP16 subnormals
            case 8: for (int i = 0; i < QK; ++i) xb[i] *= 3e9f; break;
            case 9: for (int i = 0; i < QK; ++i) xb[i] = (i & 1) ? 1.0f : -1.0f; break;  // a Hadamard-like row
            case 10: for (int i = 0; i < QK; ++i) xb[i] = 0.37f; break;                  // constant
            case 11: for (int i = 0; i < QK; ++i) xb[i] = (i % 17 == 0) ? 50.0f*nd(rng) : 0.0f; break;   // sparse
        }
    }
    const int fails = check<4>(x, nblk) + check<3>(x, nblk) + check<2>(x, nblk);
    printf("%s\n", fails ? "FAIL" : "PASS");
    return fails != 0;
}
