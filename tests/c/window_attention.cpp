// The recent window of a turbo cache (ggml_set_rows_ring, ggml_flash_attn_ext_set_ring), for tests/test_window.py:
// a SET_ROWS of random K/V rows into caches of n_stream streams (cells written in order) writes each row's window
// copy and cell 0's exact rows; the host's side is done here as llama does it (the last R cells written hold the
// window's rows, their mask moves from the cells to the window's mask). Flash attention of n_q queries is then
// compared with two references computed in double precision: "exactw" (cell 0 and the window's cells as written,
// the other cells decoded) and "decoded" (cell 0 as written, every other cell decoded). The window's keys are made
// long and the queries lean their way, so that the window takes much of each query's weight, as recent tokens do.
//   window_attention TYPE_K TYPE_V N_Q N_STREAM
//   -> lines "ERR_EXACTW <max rel err>", "ERR_DECODED <max rel err>" (max over queries and heads of |out - ref|/|ref|)
#include "ggml.h"
#include "ggml-cpu.h"
#include "ggml_test_util.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

int main(int argc, char ** argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s TYPE_K TYPE_V N_Q N_STREAM\n", argv[0]);
        return 2;
    }
    const ggml_type tk = type_named(argv[1]);
    const ggml_type tv = type_named(argv[2]);
    const int n_q = atoi(argv[3]), n_stream = atoi(argv[4]);
    const int D = 128, n_head_kv = 2, n_head = 4, kv_size = 256, n_kv = 200;   // cells 200.. are empty (masked)
    const int R = 48, R_pad = 256;                                              // the window's rows (llama: 64 + n_ubatch)
    const ggml_type rk = ggml_is_turbo(tk) ? GGML_TYPE_Q8_0 : tk;
    const ggml_type rv = ggml_is_turbo(tv) ? GGML_TYPE_Q8_0 : tv;

    ggml_init_params ip = { (size_t) 256*1024*1024, nullptr, false };
    ggml_context * ctx = ggml_init(ip);

    ggml_tensor * kc = ggml_new_tensor_2d(ctx, tk, D*n_head_kv, kv_size*n_stream);
    ggml_tensor * vc = ggml_new_tensor_2d(ctx, tv, D*n_head_kv, kv_size*n_stream);
    ggml_tensor * k0 = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, D*n_head_kv, n_stream);
    ggml_tensor * v0 = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, D*n_head_kv, n_stream);
    ggml_tensor * kr = ggml_new_tensor_3d(ctx, rk, D*n_head_kv, R, n_stream);
    ggml_tensor * vr = ggml_new_tensor_3d(ctx, rv, D*n_head_kv, R, n_stream);
    ggml_tensor * kx = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, D*n_head_kv, n_kv*n_stream);
    ggml_tensor * vx = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, D*n_head_kv, n_kv*n_stream);
    ggml_tensor * idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, n_kv*n_stream);
    memset(kc->data, 0, ggml_nbytes(kc));
    memset(vc->data, 0, ggml_nbytes(vc));
    memset(kr->data, 0x7f, ggml_nbytes(kr));   // garbage until written
    memset(vr->data, 0x7f, ggml_nbytes(vr));
    std::mt19937 rng(42);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto in_window = [&](int c) { return c >= n_kv - R && c > 0; };
    for (int64_t r = 0; r < n_kv*n_stream; ++r) {
        const int c = r % n_kv;
        for (int64_t i = 0; i < D*n_head_kv; ++i) {
            ((float *) kx->data)[r*D*n_head_kv + i] = in_window(c) ? 1.5f + 0.5f*nd(rng) : nd(rng);
            ((float *) vx->data)[r*D*n_head_kv + i] = in_window(c) ? 3.0f*nd(rng) : nd(rng);
        }
        ((int64_t *) idx->data)[r] = (r / n_kv)*kv_size + c;
    }

    ggml_cgraph * gw = ggml_new_graph(ctx);
    ggml_tensor * wk = ggml_set_rows(ctx, kc, kx, idx);
    ggml_tensor * wv = ggml_set_rows(ctx, vc, vx, idx);
    if (ggml_is_turbo(tk)) { ggml_set_rows_cell0(wk, k0); }
    if (ggml_is_turbo(tv)) { ggml_set_rows_cell0(wv, v0); }
    ggml_set_rows_ring(wk, kr);
    ggml_set_rows_ring(wv, vr);
    ggml_build_forward_expand(gw, wk);
    ggml_build_forward_expand(gw, wv);
    if (ggml_graph_compute_with_ctx(ctx, gw, 2) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "write failed\n");
        return 1;
    }

    ggml_tensor * q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, n_q, n_head, n_stream);
    for (int64_t i = 0; i < ggml_nelements(q); ++i) {
        ((float *) q->data)[i] = 0.06f + 0.1f*nd(rng);
    }
    // the host's side: the window's cells leave the main mask for the window's (ring row c % R holds cell c)
    ggml_tensor * mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, kv_size, n_q, 1, n_stream);
    ggml_tensor * mr   = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, R_pad, n_q, 1, n_stream);
    for (int s = 0; s < n_stream; ++s) {
        for (int iq = 0; iq < n_q; ++iq) {
            ggml_fp16_t * m = (ggml_fp16_t *) mask->data + (s*n_q + iq)*kv_size;
            ggml_fp16_t * w = (ggml_fp16_t *) mr->data + (s*n_q + iq)*R_pad;
            for (int c = 0; c < kv_size; ++c) {
                m[c] = ggml_fp32_to_fp16(c < n_kv && !in_window(c) ? 0.0f : -INFINITY);
            }
            for (int r = 0; r < R_pad; ++r) {
                w[r] = ggml_fp32_to_fp16(-INFINITY);
            }
            for (int c = n_kv - R; c < n_kv; ++c) {
                if (in_window(c)) {
                    w[c % R] = ggml_fp32_to_fp16(0.0f);
                }
            }
        }
    }
    ggml_tensor * kview = ggml_view_4d(ctx, kc, D, kv_size, n_head_kv, n_stream, kc->nb[1], ggml_row_size(tk, D), kc->nb[1]*kv_size, 0);
    ggml_tensor * vview = ggml_view_4d(ctx, vc, D, kv_size, n_head_kv, n_stream, vc->nb[1], ggml_row_size(tv, D), vc->nb[1]*kv_size, 0);
    ggml_tensor * k0v = ggml_view_3d(ctx, k0, D, n_head_kv, n_stream, D*sizeof(float), k0->nb[1], 0);
    ggml_tensor * v0v = ggml_view_3d(ctx, v0, D, n_head_kv, n_stream, D*sizeof(float), v0->nb[1], 0);
    ggml_tensor * krv = ggml_view_4d(ctx, kr, D, R, n_head_kv, n_stream, kr->nb[1], ggml_row_size(rk, D), kr->nb[2], 0);
    ggml_tensor * vrv = ggml_view_4d(ctx, vr, D, R, n_head_kv, n_stream, vr->nb[1], ggml_row_size(rv, D), vr->nb[2], 0);
    const float scale = 1.0f/sqrtf((float) D);
    ggml_tensor * fa = ggml_flash_attn_ext(ctx, q, kview, vview, mask, scale, 0.0f, 0.0f);
    ggml_flash_attn_ext_set_cell0(fa, ggml_is_turbo(tk) ? k0v : nullptr, ggml_is_turbo(tv) ? v0v : nullptr);
    ggml_flash_attn_ext_set_ring(fa, krv, vrv, mr);
    ggml_prec_set_acc(fa, GGML_PREC_F32);
    ggml_cgraph * ga = ggml_new_graph(ctx);
    ggml_build_forward_expand(ga, fa);
    if (ggml_graph_compute_with_ctx(ctx, ga, 2) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "attention failed\n");
        return 1;
    }

    // references; fa: [D, n_head, n_q, n_stream]. A cell "as written": its exact row where the side is turbo (the
    // window's q8_0 rounding is the difference left), the row as stored where it is not (what its window copy holds)
    double err[2] = { 0, 0 };
    for (int s = 0; s < n_stream; ++s) {
        for (int h = 0; h < n_head; ++h) {
            const int hk = h / (n_head/n_head_kv);
            for (int iq = 0; iq < n_q; ++iq) {
                const float * qr = (const float *) ((char *) q->data + iq*q->nb[1] + h*q->nb[2] + s*q->nb[3]);
                const float * out = (const float *) ((char *) fa->data + h*fa->nb[1] + iq*fa->nb[2] + s*fa->nb[3]);
                for (int ref = 0; ref < 2; ++ref) {   // 0: exactw, 1: decoded
                    std::vector<double> sc(n_kv), o(D, 0.0);
                    double mx = -INFINITY, sum = 0;
                    auto row = [&](bool is_k, int c) {
                        const ggml_tensor * cache = is_k ? kc : vc;
                        const ggml_type t = cache->type;
                        const bool exact = ggml_is_turbo(t) && (c == 0 || (ref == 0 && in_window(c)));
                        const float * x = (const float *) (is_k ? kx : vx)->data + ((int64_t) s*n_kv + c)*D*n_head_kv + hk*D;
                        const char * stored = (const char *) cache->data + (s*kv_size + c)*cache->nb[1] + hk*ggml_row_size(t, D);
                        return exact ? std::vector<float>(x, x + D) : row_f32(t, stored, D);
                    };
                    for (int c = 0; c < n_kv; ++c) {
                        const std::vector<float> kf = row(true, c);
                        double d = 0;
                        for (int i = 0; i < D; ++i) { d += (double) qr[i]*kf[i]; }
                        sc[c] = d*scale;
                        mx = std::max(mx, sc[c]);
                    }
                    for (int c = 0; c < n_kv; ++c) {
                        const std::vector<float> vf = row(false, c);
                        const double w = exp(sc[c] - mx);
                        sum += w;
                        for (int i = 0; i < D; ++i) { o[i] += w*vf[i]; }
                    }
                    double e2 = 0, r2 = 0;
                    for (int i = 0; i < D; ++i) {
                        const double ri = o[i]/sum;
                        e2 += (out[i] - ri)*(out[i] - ri);
                        r2 += ri*ri;
                    }
                    err[ref] = std::max(err[ref], sqrt(e2/r2));
                }
            }
        }
    }
    printf("ERR_EXACTW %.3e\nERR_DECODED %.3e\n", err[0], err[1]);
    ggml_free(ctx);
    return 0;
}
