// The exact cell-0 rows of a turbo cache (ggml_set_rows_cell0, ggml_flash_attn_ext_set_cell0), for
// tests/test_cell0.py: a SET_ROWS of random K/V rows into turbo caches of n_stream streams writes cell 0's rows, then
// flash attention of n_q queries over all cells is compared with two references computed here in double precision:
// "exact0" (cell 0's K and V as written, every other cell decoded by the type's to_float) and "decoded0" (every cell
// decoded). Cell 0's key is made large, as a sink token's attention is (it takes much of every query's weight).
//   cell0_attention TYPE_K TYPE_V N_Q N_STREAM NAN_HEAD
//     NAN_HEAD >= 0: that KV head's cell-0 rows are set to NaN after the write (not known exactly: decoded)
//   -> lines "ERR_EXACT0 <max rel err>", "ERR_DECODED0 <max rel err>" (max over queries and heads of
//      |out - ref| / |ref|), and for NAN_HEAD the same two for that head alone ("NANHEAD_EXACT0", "NANHEAD_DECODED0")
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
    if (argc != 6) {
        fprintf(stderr, "usage: %s TYPE_K TYPE_V N_Q N_STREAM NAN_HEAD\n", argv[0]);
        return 2;
    }
    const ggml_type tk = type_named(argv[1]);
    const ggml_type tv = type_named(argv[2]);
    const int n_q = atoi(argv[3]), n_stream = atoi(argv[4]), nan_head = atoi(argv[5]);
    const int D = 128, n_head_kv = 2, n_head = 4, kv_size = 256, n_kv = 200;   // cells 200.. are empty (masked)

    ggml_init_params ip = { (size_t) 256*1024*1024, nullptr, false };
    ggml_context * ctx = ggml_init(ip);

    // the caches, their cell-0 rows, and the rows written: every cell < n_kv of every stream
    ggml_tensor * kc = ggml_new_tensor_2d(ctx, tk, D*n_head_kv, kv_size*n_stream);
    ggml_tensor * vc = ggml_new_tensor_2d(ctx, tv, D*n_head_kv, kv_size*n_stream);
    ggml_tensor * k0 = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, D*n_head_kv, n_stream);
    ggml_tensor * v0 = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, D*n_head_kv, n_stream);
    ggml_tensor * kx = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, D*n_head_kv, n_kv*n_stream);
    ggml_tensor * vx = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, D*n_head_kv, n_kv*n_stream);
    ggml_tensor * idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, n_kv*n_stream);
    memset(kc->data, 0, ggml_nbytes(kc));
    memset(vc->data, 0, ggml_nbytes(vc));
    std::mt19937 rng(42);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int64_t r = 0; r < n_kv*n_stream; ++r) {
        const bool cell0 = r % n_kv == 0;
        for (int64_t i = 0; i < D*n_head_kv; ++i) {
            // a sink: cell 0's key points the way the queries do (below) and is long; its value is large too
            ((float *) kx->data)[r*D*n_head_kv + i] = cell0 ? 3.0f + 0.5f*nd(rng) : nd(rng);
            ((float *) vx->data)[r*D*n_head_kv + i] = cell0 ? 4.0f*nd(rng) : nd(rng);
        }
        // the write order is shuffled: stream s's cells are s*kv_size + cell
        ((int64_t *) idx->data)[r] = (r / n_kv)*kv_size + (r % n_kv);
    }
    for (float * p = (float *) k0->data, * e = p + ggml_nelements(k0); p < e; ++p) { *p = 12345.0f; } // overwritten
    for (float * p = (float *) v0->data, * e = p + ggml_nelements(v0); p < e; ++p) { *p = 12345.0f; }

    ggml_cgraph * gw = ggml_new_graph(ctx);
    ggml_tensor * wk = ggml_set_rows(ctx, kc, kx, idx);
    ggml_tensor * wv = ggml_set_rows(ctx, vc, vx, idx);
    if (ggml_is_turbo(tk)) { ggml_set_rows_cell0(wk, k0); }
    if (ggml_is_turbo(tv)) { ggml_set_rows_cell0(wv, v0); }
    ggml_build_forward_expand(gw, wk);
    ggml_build_forward_expand(gw, wv);
    if (ggml_graph_compute_with_ctx(ctx, gw, 2) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "write failed\n");
        return 1;
    }
    if (nan_head >= 0) {
        for (int s = 0; s < n_stream; ++s) {
            ((float *) k0->data)[s*D*n_head_kv + nan_head*D] = NAN;
            ((float *) v0->data)[s*D*n_head_kv + nan_head*D] = NAN;
        }
    }

    // queries: lean towards the sink's key (positive), scaled so that cell 0 takes a good part of the weight
    ggml_tensor * q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, n_q, n_head, n_stream);
    for (int64_t i = 0; i < ggml_nelements(q); ++i) {
        ((float *) q->data)[i] = 0.08f + 0.1f*nd(rng);
    }
    ggml_tensor * mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, kv_size, n_q);
    for (int iq = 0; iq < n_q; ++iq) {
        for (int c = 0; c < kv_size; ++c) {
            ((ggml_fp16_t *) mask->data)[iq*kv_size + c] = ggml_fp32_to_fp16(c < n_kv ? 0.0f : -INFINITY);
        }
    }
    // the attention's view: [D, kv_size, n_head_kv, n_stream], cell-0 rows [D, n_head_kv, n_stream]
    ggml_tensor * kview = ggml_view_4d(ctx, kc, D, kv_size, n_head_kv, n_stream, kc->nb[1], ggml_row_size(tk, D), kc->nb[1]*kv_size, 0);
    ggml_tensor * vview = ggml_view_4d(ctx, vc, D, kv_size, n_head_kv, n_stream, vc->nb[1], ggml_row_size(tv, D), vc->nb[1]*kv_size, 0);
    ggml_tensor * k0v = ggml_view_3d(ctx, k0, D, n_head_kv, n_stream, D*sizeof(float), k0->nb[1], 0);
    ggml_tensor * v0v = ggml_view_3d(ctx, v0, D, n_head_kv, n_stream, D*sizeof(float), v0->nb[1], 0);
    const float scale = 1.0f/sqrtf((float) D);
    ggml_tensor * fa = ggml_flash_attn_ext(ctx, q, kview, vview, mask, scale, 0.0f, 0.0f);
    ggml_flash_attn_ext_set_cell0(fa, ggml_is_turbo(tk) ? k0v : nullptr, ggml_is_turbo(tv) ? v0v : nullptr);
    ggml_prec_set_acc(fa, GGML_PREC_F32);
    ggml_cgraph * ga = ggml_new_graph(ctx);
    ggml_build_forward_expand(ga, fa);
    if (ggml_graph_compute_with_ctx(ctx, ga, 2) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "attention failed\n");
        return 1;
    }

    // references; fa: [D, n_head, n_q, n_stream]
    double err[2] = { 0, 0 }, err_nan[2] = { 0, 0 };
    for (int s = 0; s < n_stream; ++s) {
        for (int h = 0; h < n_head; ++h) {
            const int hk = h / (n_head/n_head_kv);
            for (int iq = 0; iq < n_q; ++iq) {
                const float * qr = (const float *) ((char *) q->data + iq*q->nb[1] + h*q->nb[2] + s*q->nb[3]);
                const float * out = (const float *) ((char *) fa->data + h*fa->nb[1] + iq*fa->nb[2] + s*fa->nb[3]);
                for (int ref = 0; ref < 2; ++ref) {   // 0: exact0, 1: decoded0
                    std::vector<double> sc(n_kv), o(D, 0.0);
                    double mx = -INFINITY, sum = 0;
                    for (int c = 0; c < n_kv; ++c) {
                        const int64_t r = (int64_t) s*n_kv + c;   // row of kx/vx
                        const bool exact = ref == 0 && c == 0;
                        const char * krow = (const char *) kc->data + (s*kv_size + c)*kc->nb[1] + hk*ggml_row_size(tk, D);
                        std::vector<float> kf = exact && ggml_is_turbo(tk) ? std::vector<float>((float *) kx->data + r*D*n_head_kv + hk*D,
                                                                                                  (float *) kx->data + r*D*n_head_kv + hk*D + D)
                                                                           : row_f32(tk, krow, D);
                        double d = 0;
                        for (int i = 0; i < D; ++i) { d += (double) qr[i]*kf[i]; }
                        sc[c] = d*scale;
                        mx = std::max(mx, sc[c]);
                    }
                    for (int c = 0; c < n_kv; ++c) {
                        const int64_t r = (int64_t) s*n_kv + c;
                        const bool exact = ref == 0 && c == 0;
                        const char * vrow = (const char *) vc->data + (s*kv_size + c)*vc->nb[1] + hk*ggml_row_size(tv, D);
                        std::vector<float> vf = exact && ggml_is_turbo(tv) ? std::vector<float>((float *) vx->data + r*D*n_head_kv + hk*D,
                                                                                                  (float *) vx->data + r*D*n_head_kv + hk*D + D)
                                                                           : row_f32(tv, vrow, D);
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
                    const double rel = sqrt(e2/r2);
                    double & e = hk == nan_head ? err_nan[ref] : err[ref];
                    e = std::max(e, rel);
                }
            }
        }
    }
    printf("ERR_EXACT0 %.3e\nERR_DECODED0 %.3e\n", err[0], err[1]);
    if (nan_head >= 0) {
        printf("NANHEAD_EXACT0 %.3e\nNANHEAD_DECODED0 %.3e\n", err_nan[0], err_nan[1]);
    }
    ggml_free(ctx);
    return 0;
}
