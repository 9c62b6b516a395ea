// Host check of the 4-threads-per-block KV write (turbo_t4_encode_store in cuda/turbo.cu): a warp of 32
// threads emulated with std::thread and a barrier at every warp primitive, its 8 blocks' bytes compared with the
// C reference (quantize_row_turbo*_ref, cpu_ref/), which the CUDA path must equal bit for bit.
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>
#include "ggml.h"
#include "ggml-turbo.h"

#include "cuda_host_shims.h"   // the CUDA names of the encode helpers as host code

// the warp: 32 threads meeting at a barrier around every exchange
static std::barrier<> * g_bar;
static thread_local int g_lane;
static float g_f[32]; static int g_i[32];
static inline float __shfl_xor_sync(unsigned, float v, int x) {
    g_f[g_lane] = v; g_bar->arrive_and_wait(); const float r = g_f[g_lane ^ x]; g_bar->arrive_and_wait(); return r;
}
static inline int __shfl_xor_sync(unsigned, int v, int x) {
    g_i[g_lane] = v; g_bar->arrive_and_wait(); const int r = g_i[g_lane ^ x]; g_bar->arrive_and_wait(); return r;
}
static inline float __shfl_sync(unsigned, float v, int src) {
    g_f[g_lane] = v; g_bar->arrive_and_wait(); const float r = g_f[src]; g_bar->arrive_and_wait(); return r;
}
static inline bool __any_sync(unsigned, bool p) {
    g_i[g_lane] = p; g_bar->arrive_and_wait();
    bool r = false; for (int l = 0; l < 32; ++l) r |= g_i[l] != 0;
    g_bar->arrive_and_wait(); return r;
}
#include "turbo_helpers.inc"   // turbo_code_of, turbo_norm_half (from cuda/turbo-common.cuh)
#include "t4_src.inc"

template <int bits>
static int check(const std::vector<float> & x) {   // x: 8 blocks of 128
    const int bs = bits == 3 ? 50 : 34;
    std::vector<uint8_t> got(8*bs, 0xAB), ref(8*bs);
    std::barrier<> bar(32); g_bar = &bar;
    std::vector<std::thread> th;
    for (int lane = 0; lane < 32; ++lane) {
        th.emplace_back([&, lane] {
            g_lane = lane;
            const int g = lane >> 2, t = lane & 3;
            float v[8][4];
            for (int m = 0; m < 8; ++m) for (int c = 0; c < 4; ++c) v[m][c] = x[g*128 + 16*m + 4*t + c];
            turbo_t4_encode_store<bits>(v, got.data() + g*bs, t, lane);
        });
    }
    for (auto & t : th) t.join();
    if (bits == 3) quantize_row_turbo3_ref(x.data(), (block_turbo3 *) ref.data(), 8*128);
    else           quantize_row_turbo2_ref(x.data(), (block_turbo2 *) ref.data(), 8*128);
    int bad = 0;
    for (int b = 0; b < 8; ++b) bad += memcmp(got.data() + b*bs, ref.data() + b*bs, bs) != 0;
    return bad;
}

int main() {
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    int fails = 0, blocks = 0;
    for (int trial = 0; trial < 40; ++trial) {
        std::vector<float> x(8*128);
        for (auto & v : x) v = nd(rng);
        // special blocks: zeros, tiny, huge (the pre-scaled path), one NaN, one Inf, a spike
        if (trial % 4 == 1) { for (int i = 0; i < 128; ++i) x[i] = 0.0f; for (int i = 128; i < 256; ++i) x[i] *= 1e-30f; }
        if (trial % 4 == 2) { for (int i = 256; i < 384; ++i) x[i] *= 3e37f; x[400] = NAN; x[600] = INFINITY; }
        if (trial % 4 == 3) { x[700] = 1e6f; x[900] = -5e9f; }
        const int b3 = check<3>(x), b2 = check<2>(x);
        fails += b3 + b2; blocks += 16;
    }
    printf("%d of %d blocks differ from the C reference\n%s\n", fails, blocks, fails ? "FAIL" : "PASS");
    return fails != 0;
}
