// Host check of the 2-threads-per-block KV write (cuda/turbo-encode-t2.cuh): each block's pair of threads emulated
// with two std::threads meeting at a barrier for every exchange, the blocks' bytes compared with the C reference
// (quantize_row_turbo*_ref, cpu_ref/ggml-turbo.c), which the CUDA path must equal bit for bit. Also the code search
// alone, on values at and next to every boundary, against the reference's count of the boundaries below y.
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>
#include "ggml-turbo.h"
#include "turbo-codebooks.h"

#define TURBO_T2_HOST_CHECK
#include "cuda_host_shims.h"   // the CUDA names of the encode helpers as host code

// the pair: two threads exchanging through a barrier
static std::barrier<> * g_bar;
static thread_local int g_par;
static uint32_t g_x[2];
static inline uint32_t turbo_t2_partner(const uint32_t v) {
    g_x[g_par] = v; g_bar->arrive_and_wait(); const uint32_t r = g_x[g_par ^ 1]; g_bar->arrive_and_wait(); return r;
}
static inline float turbo_t2_partner(const float v) { return __uint_as_float(turbo_t2_partner(__float_as_uint(v))); }
#include "turbo_helpers.inc"   // turbo_norm_half, turbo_prescale (from cuda/turbo-common.cuh)
#include "turbo-encode-t2.cuh"

// encodes block x (minus off) as the kernel does (fast path on the pair, else the slow path on thread 0) at dst
template <int bits>
static bool encode_pair(const float * x, const float * off, uint8_t * dst) {
    float c2tab[4];
    for (int m = 0; m < (1 << (bits - 1)); ++m) c2tab[m] = turbo_t2_c2<bits>(m);
    std::barrier<> bar(2); g_bar = &bar;
    bool fast[2];
    std::thread th[2];
    for (int par = 0; par < 2; ++par) {
        th[par] = std::thread([&, par] {
            g_par = par;
            turbo_t2_out o;
            fast[par] = off ? turbo_t2_encode_fast<bits, true>(x, off, c2tab, par, o) : turbo_t2_encode_fast<bits, false>(x, nullptr, c2tab, par, o);
            g_bar->arrive_and_wait();   // both done with the exchanges before either stores
            if (fast[par]) turbo_t2_store<bits>(dst, o, par);
            else if (par == 0) turbo_t2_encode_slow<bits>(x, off, dst);
        });
    }
    th[0].join(); th[1].join();
    return fast[0];
}

template <int bits>
static int check_block(const float * x, const float * off, int & n_slow) {
    const int bs = bits == 3 ? 50 : 34;
    float d[QK_TURBO];
    for (int i = 0; i < QK_TURBO; ++i) d[i] = off ? x[i] - off[i] : x[i];
    uint8_t ref[64];
    if (bits == 3) quantize_row_turbo3_ref(d, (block_turbo3 *) ref, QK_TURBO);
    else           quantize_row_turbo2_ref(d, (block_turbo2 *) ref, QK_TURBO);
    int bad = 0;
    for (int align = 0; align < 2; ++align) {   // a block at a 4-byte boundary, and 2 bytes past one
        alignas(16) uint8_t buf[80];
        memset(buf, 0xAB, sizeof(buf));
        uint8_t * dst = buf + 4 + 2*align;
        n_slow += !encode_pair<bits>(x, off, dst);
        bad += memcmp(dst, ref, bs) != 0 || buf[3 + 2*align] != 0xAB || dst[bs] != 0xAB;
    }
    return bad;
}

// the code search alone: turbo_t2_mag / turbo_t2_nonpos against the count of boundaries below y
template <int bits>
static int check_codes() {
    const float * b = bits == 3 ? turbo3_boundaries : turbo2_boundaries;
    const int nb = bits == 3 ? 7 : 3;
    const turbo_t2_book<bits> bk = turbo_t2_book_load<bits>();
    std::vector<float> ys = {0.0f, -0.0f, 1.0f, -1.0f, 1e-30f, -1e-30f, 0.5f, -0.5f};
    for (int k = 0; k < nb; ++k) {
        ys.push_back(b[k]); ys.push_back(-b[k]);
        ys.push_back(nextafterf(b[k], 1.0f)); ys.push_back(nextafterf(b[k], -1.0f));
    }
    int bad = 0;
    for (const float y : ys) {
        int ref = 0;
        for (int k = 0; k < nb; ++k) ref += y > b[k];
        const uint32_t yb = __float_as_uint(y), m = turbo_t2_mag<bits>(yb, bk);
        const bool np = turbo_t2_nonpos(yb);
        const uint32_t lo = (bits == 3 ? m : m | 2u) ^ (np ? 3u : 0u);
        const int code = (int) (bits == 3 ? lo | (np ? 0u : 4u) : lo);
        if (code != ref) { printf("code of %a: %d, reference %d\n", y, code, ref); ++bad; }
    }
    return bad;
}

int main() {
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    int fails = check_codes<3>() + check_codes<2>(), blocks = 0, n_slow = 0;
    float off[QK_TURBO];
    for (auto & v : off) v = 0.5f*nd(rng);
    for (int trial = 0; trial < 120; ++trial) {
        float x[QK_TURBO];
        for (auto & v : x) v = nd(rng);
        switch (trial % 10) {   // special blocks among the Gaussian ones
            case 1: for (auto & v : x) v = 0.0f; break;                           // zero
            case 2: for (auto & v : x) v *= 1e-30f; break;                        // squares underflow: zero block
            case 3: for (auto & v : x) v *= 3e37f; break;                         // pre-scaled (slow path)
            case 4: x[17] = NAN; break;                                           // zero block (slow path)
            case 5: x[90] = -INFINITY; break;
            case 6: x[3] = 1e6f; x[70] = -5e9f; break;                            // one value above 2^32
            case 7: for (int i = 0; i < QK_TURBO; ++i) x[i] = (i % 3) ? 0.0f : -0.0f; x[5] = 1.0f; break;   // signed zeros
            case 8: for (auto & v : x) v *= 3e9f; break;                          // |t| above 2^35, values below 2^32
            case 9: for (int i = 0; i < QK_TURBO; ++i) x[i] = (i & 1) ? 1.0f : -1.0f; break;   // a Hadamard-like row
        }
        { int s0 = n_slow; const int f3 = check_block<3>(x, nullptr, n_slow), f2 = check_block<2>(x, nullptr, n_slow); if (getenv("T2_DEBUG")) printf("trial %d: turbo3 %d turbo2 %d slow %d\n", trial, f3, f2, n_slow - s0); fails += f3 + f2; }
        fails += check_block<3>(x, off, n_slow) + check_block<2>(x, off, n_slow);
        blocks += 8;
    }
    printf("%d of %d blocks differ from the C reference (%d went through the slow path)\n%s\n", fails, blocks, n_slow,
           fails ? "FAIL" : "PASS");
    return fails != 0;
}
