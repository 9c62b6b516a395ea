// Host check of the fused-RoPE math (turbo_rope_cs / turbo_rope_block from cuda/turbo.cu, compiled as host
// code with a warp emulated lane by lane) against ggml's CPU ROPE, normal and neox, with and without YaRN: what the
// kernels do on load (ggml_cuda_turbo_rope_on_load_ok), normal RoPE of 128- and 256-wide heads, neox of 128-wide ones,
// in 128-value blocks; and in the 64-value types' blocks (2 values per lane) normal and neox RoPE of 64-wide heads,
// normal of 128-wide ones; each with and without the folded MUL and frequency factors.
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>
#include "ggml.h"
#include "ggml-cpu.h"
#define __device__
#define __forceinline__ inline
// lane-emulated shuffle: the block function is run for all 32 lanes in lockstep, k by k (see below)
static float g_lane_vals[32];
static int g_cur_lane;
static inline float __shfl_xor_sync(unsigned, float, int x) { return g_lane_vals[g_cur_lane ^ x]; }
static inline float __fmul_rn(float a, float b) { return a*b; }   // host: the f32 product (x86-64 g++ -O1 contracts nothing)
#include "rope_src.inc"

// the head's blocks of 32 NV values, as the kernels' warps take them
template <int NV>
static void rope_blocks(const turbo_rope & rp, const std::vector<float> & x, std::vector<float> & out, const int D, const int pos) {
    for (int b = 0; b < D/(32*NV); ++b) {
        const int e0 = 32*NV*b;
        float v[32][NV];
        for (int l = 0; l < 32; ++l) for (int k = 0; k < NV; ++k) { v[l][k] = x[e0 + l + 32*k]; }
        // lockstep emulation: value k of lane l comes from a run of the block function in which every shuffle
        // returns the partner lane's value k (the other outputs of that run are discarded); with rp.mul the partner
        // has multiplied its value before the shuffle
        float res[32][NV];
        for (int l = 0; l < 32; ++l) {
            g_cur_lane = l;
            for (int k = 0; k < NV; ++k) {
                for (int q = 0; q < 32; ++q) g_lane_vals[q] = rp.mul ? __fmul_rn(v[q][k], rp.mul[e0 + q + 32*k]) : v[q][k];
                float one[NV];
                for (int m = 0; m < NV; ++m) one[m] = v[l][m];
                turbo_rope_pre<NV> pre;
                turbo_rope_preload<NV>(rp, e0, l, pre);
                turbo_rope_block<NV>(rp, one, e0, pos, pre, l);
                res[l][k] = one[k];
            }
        }
        for (int l = 0; l < 32; ++l) for (int k = 0; k < NV; ++k) out[e0 + l + 32*k] = res[l][k];
    }
}

int main() {
    int fails = 0;
    for (int D : {64, 128, 256}) for (int qk : {128, 64}) for (int mode : {0, 2}) for (float ext : {0.0f, 1.0f}) for (int pos : {0, 7, 513, 4095, 100000}) for (int with_mul : {0, 1}) for (int with_ff : {0, 1}) {
        // a block lies in one head; a neox pair (m, m + D/2) in one block (else the RoPE is not done on load)
        if (D % qk != 0 || (mode == 2 && D != qk) || (qk == 64 && D == 256)) {
            continue;
        }
        const int n_dims = D;
        const float freq_base = 10000.0f, freq_scale = ext != 0.0f ? 0.25f : 1.0f, attn_factor = 1.0f, beta_fast = 32.0f, beta_slow = 1.0f;
        const int n_ctx_orig = 4096;
        std::vector<float> x(D);
        for (int i = 0; i < D; ++i) x[i] = sinf(0.37f*i + 0.11f*pos) * (1.0f + 0.01f*i);
        // ggml CPU reference
        ggml_init_params ip = { 16*1024*1024, nullptr, false };
        ggml_context * ctx = ggml_init(ip);
        ggml_tensor * a = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, D, 1, 1);
        ggml_tensor * p = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 1);
        memcpy(a->data, x.data(), D*sizeof(float)); ((int32_t *) p->data)[0] = pos;
        // with_mul: llama's q*D / k/D before the RoPE (patch 0041), which the kernels fold in (turbo_rope::mul)
        std::vector<float> gain(D);
        for (int i = 0; i < D; ++i) gain[i] = 0.5f + 1.5f*fabsf(sinf(0.73f*(i/2) + 0.3f));
        if (with_mul) {
            ggml_tensor * g = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, D);
            memcpy(g->data, gain.data(), D*sizeof(float));
            a = ggml_mul(ctx, a, g);
        }
        // with_ff: frequency factors (Llama 3's rope_freqs), one per pair
        std::vector<float> ff(n_dims/2);
        for (int i = 0; i < n_dims/2; ++i) ff[i] = 1.0f + 7.0f*(float) i/(n_dims/2);
        ggml_tensor * fft = nullptr;
        if (with_ff) {
            fft = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n_dims/2);
            memcpy(fft->data, ff.data(), ff.size()*sizeof(float));
        }
        ggml_tensor * r = ggml_rope_ext(ctx, a, p, fft, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext, attn_factor, beta_fast, beta_slow);
        ggml_cgraph * gf = ggml_new_graph(ctx); ggml_build_forward_expand(gf, r);
        ggml_graph_compute_with_ctx(ctx, gf, 1);
        // the fused kernel's math
        turbo_rope rp{};
        int32_t posv = pos; rp.pos = &posv; rp.freq_factors = with_ff ? ff.data() : nullptr; rp.D = D; rp.n_dims = n_dims; rp.n_offs = 0; rp.neox = mode == 2;
        rp.theta_scale = powf(freq_base, -2.0f/n_dims); rp.freq_scale = freq_scale; rp.ext_factor = ext; rp.attn_factor = attn_factor;
        float corr[2]; ggml_rope_yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow, corr);
        rp.corr0 = corr[0]; rp.corr1 = corr[1];
        rp.mul = with_mul ? gain.data() : nullptr;
        std::vector<float> out(D);
        if (qk == 128) {
            rope_blocks<4>(rp, x, out, D, pos);
        } else {
            rope_blocks<2>(rp, x, out, D, pos);
        }
        double maxd = 0;
        for (int i = 0; i < D; ++i) maxd = fmax(maxd, fabs(out[i] - ((float *) r->data)[i]));
        printf("D=%d qk=%d mode=%d ext=%.0f pos=%6d mul=%d ff=%d max|diff|=%.3g\n", D, qk, mode, ext, pos, with_mul, with_ff, maxd);
        // float angles: the difference grows with the position, and with the head size (ggml's CPU steps the angle
        // by repeated multiplication, the kernels take powf per pair; 256-wide heads: twice the steps)
        if (maxd > (with_mul ? 2 : 1)*(1.5e-7*(D > 128 ? D/128 : 1)*(pos + 1) + 1e-6)) fails++;   // gains up to 2
        ggml_free(ctx);
    }
    printf("%s\n", fails ? "FAIL" : "PASS");
    return fails != 0;
}
