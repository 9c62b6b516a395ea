// turbo-llama: bit-exactness of the CUDA turbo write path against the CPU reference.
//
// SET_ROWS (f32 and f16 sources) and CPY into turbo4/turbo3/turbo2 and their 64-value forms (turbo4_64/turbo3_64/
// turbo2_64, one warp per 64-block, cuda/turbo.cu's kernels) are computed on CUDA0 through ggml-backend;
// every written block is compared byte for byte with ggml_quantize_chunk (= quantize_row_turbo*_ref, *_64_ref).
// GET_ROWS back to f32 on CUDA0 is compared bit for bit with the type's to_float (dequantize_row_turbo*).
// Rows cover normal, uniform, large (> 2^32, the rescaled path), small (FP16-subnormal norms), constant,
// sparse, Hadamard-like, zero, NaN and Inf inputs. Exit status 0 only if every byte matches.
//
// build: g++ -O2 -std=c++17 test-turbo-cuda.cpp -I<tree>/ggml/include -L<build>/bin -lggml -lggml-base -lggml-cpu -lggml-cuda
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cuda.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <random>
#include <vector>

static const int NCOLS = 1024;     // 8 blocks of 128 (16 of 64) per row
// rows of a case: 512 (4096 blocks: f32 rows take the bulk 2-thread write kernel) or 48 (384 blocks: the warp
// kernel, as a decode step's writes); f16 rows and turbo4 always take the warp kernel
static int NROWS = 512;
static const int NDST  = 600;

static void fill_rows(std::vector<float> & x, std::mt19937 & rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
    for (int r = 0; r < NROWS; ++r) {
        float * row = x.data() + (size_t) r*NCOLS;
        const int kind = r % 12;
        for (int i = 0; i < NCOLS; ++i) {
            float v = nd(rng);
            switch (kind) {
                case 0: case 1: case 2: break;                                  // N(0, 1)
                case 3: v = ud(rng); break;                                     // U(-1, 1)
                case 4: v = nd(rng)*3.0e12f; break;                             // amax > 2^32: rescaled path
                case 5: v = nd(rng)*1.0e-6f; break;                             // norm in FP16 subnormals
                case 6: v = 0.37f; break;                                       // constant
                case 7: v = (i % 17 == 0) ? nd(rng)*50.0f : 0.0f; break;        // sparse with outliers
                case 8: v = (__builtin_popcount(i & 127 & 0x55) & 1) ? -1.0f : 1.0f; break; // Hadamard-like
                case 9: v = nd(rng)*1.0e3f + 20.0f; break;                      // offset, large
                case 10: v = nd(rng)*2.0e38f; break;                            // near FLT_MAX: saturated norm
                case 11: v = nd(rng)*0.02f; break;                              // typical K/V scale
            }
            row[i] = v;
        }
        if (kind == 6 && (r / 12) % 3 == 0) { for (int i = 0; i < 128; ++i) row[i] = 0.0f; }    // zero block
        if (kind == 7 && (r / 12) % 3 == 1) { row[5] = NAN; }                                    // NaN block
        if (kind == 7 && (r / 12) % 3 == 2) { row[300] = INFINITY; }                             // Inf block
    }
}

static int run_case(ggml_backend_t be, ggml_type type, ggml_type src_type, bool use_cpy, std::mt19937 & rng) {
    ggml_init_params ip = { 16*ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * src = ggml_new_tensor_2d(ctx, src_type, NCOLS, NROWS);
    ggml_tensor * idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, NROWS);
    ggml_tensor * dst = ggml_new_tensor_2d(ctx, type, NCOLS, use_cpy ? NROWS : NDST);
    ggml_tensor * out = use_cpy ? ggml_cpy(ctx, src, dst) : ggml_set_rows(ctx, dst, src, idx);
    ggml_tensor * ridx = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, use_cpy ? NROWS : NDST);
    ggml_tensor * back = ggml_get_rows(ctx, out, ridx);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, back);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);

    std::vector<float> x((size_t) NROWS*NCOLS);
    fill_rows(x, rng);
    if (src_type == GGML_TYPE_F32) {
        ggml_backend_tensor_set(src, x.data(), 0, ggml_nbytes(src));
    } else {
        std::vector<ggml_fp16_t> h(x.size());
        ggml_fp32_to_fp16_row(x.data(), h.data(), (int64_t) x.size());
        ggml_fp16_to_fp32_row(h.data(), x.data(), (int64_t) x.size());      // the values the GPU sees
        ggml_backend_tensor_set(src, h.data(), 0, ggml_nbytes(src));
    }
    const int ndst = use_cpy ? NROWS : NDST;
    std::vector<int64_t> perm(NROWS);
    {
        std::vector<int64_t> all(NDST);
        for (int i = 0; i < NDST; ++i) all[i] = i;
        std::shuffle(all.begin(), all.end(), rng);
        for (int i = 0; i < NROWS; ++i) perm[i] = use_cpy ? i : all[i];
    }
    ggml_backend_tensor_set(idx, perm.data(), 0, ggml_nbytes(idx));
    std::vector<int32_t> rid(ndst);
    for (int i = 0; i < ndst; ++i) rid[i] = i;
    ggml_backend_tensor_set(ridx, rid.data(), 0, ggml_nbytes(ridx));
    const size_t row_size = ggml_row_size(type, NCOLS);
    std::vector<uint8_t> zero(row_size*ndst, 0);
    ggml_backend_tensor_set(dst, zero.data(), 0, zero.size());

    if (ggml_backend_graph_compute(be, gf) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "graph compute failed\n");
        return 1;
    }
    std::vector<uint8_t> got(row_size*ndst);
    ggml_backend_tensor_get(dst, got.data(), 0, got.size());
    std::vector<float> got_f((size_t) ndst*NCOLS);
    ggml_backend_tensor_get(back, got_f.data(), 0, got_f.size()*sizeof(float));

    std::vector<uint8_t> ref(row_size);
    std::vector<float> ref_f(NCOLS);
    const ggml_type_traits * tt = ggml_get_type_traits(type);
    int rows_ok = 0, blocks_bad = 0, deq_bad = 0;
    for (int r = 0; r < NROWS; ++r) {
        ggml_quantize_chunk(type, x.data() + (size_t) r*NCOLS, ref.data(), 0, 1, NCOLS, nullptr);
        const uint8_t * g = got.data() + (size_t) perm[r]*row_size;
        bool ok = true;
        for (int b = 0; b < NCOLS/ggml_blck_size(type); ++b) {
            const size_t bs = ggml_type_size(type);
            if (memcmp(g + b*bs, ref.data() + b*bs, bs) != 0) {
                ok = false;
                if (blocks_bad++ < 5) {
                    fprintf(stderr, "  mismatch row %d (kind %d) block %d: norm gpu %04x cpu %04x\n", r, r % 12, b,
                        *(const uint16_t *) (g + b*bs), *(const uint16_t *) (ref.data() + b*bs));
                }
            }
        }
        rows_ok += ok;
        tt->to_float(g, ref_f.data(), NCOLS);
        if (memcmp(ref_f.data(), got_f.data() + (size_t) perm[r]*NCOLS, NCOLS*sizeof(float)) != 0) {
            deq_bad++;
        }
    }
    printf("BITEXACT %-9s %-8s src %-3s rows %3d: %d/%d rows identical (%d blocks differ); GET_ROWS f32 decode: %d/%d rows bit-identical\n",
        ggml_type_name(type), use_cpy ? "CPY" : "SET_ROWS", ggml_type_name(src_type), NROWS, rows_ok, NROWS, blocks_bad, NROWS - deq_bad, NROWS);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return rows_ok == NROWS && deq_bad == 0 ? 0 : 1;
}

int main() {
    ggml_backend_t be = ggml_backend_cuda_init(0);
    if (!be) {
        fprintf(stderr, "no CUDA backend\n");
        return 2;
    }
    std::mt19937 rng(1234);
    int fails = 0;
    for (int rows : { 512, 48 }) {
        NROWS = rows;
        for (ggml_type type : { GGML_TYPE_TURBO4, GGML_TYPE_TURBO3, GGML_TYPE_TURBO2,
                                GGML_TYPE_TURBO4_64, GGML_TYPE_TURBO3_64, GGML_TYPE_TURBO2_64 }) {
            for (ggml_type st : { GGML_TYPE_F32, GGML_TYPE_F16 }) {
                fails += run_case(be, type, st, false, rng);
                fails += run_case(be, type, st, true, rng);
            }
        }
    }
    printf("BITEXACT %s (%d failing cases)\n", fails == 0 ? "PASS" : "FAIL", fails);
    ggml_backend_free(be);
    return fails == 0 ? 0 : 1;
}
