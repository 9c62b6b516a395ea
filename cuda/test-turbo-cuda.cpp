// turbo-llama: bit-exactness of the CUDA turbo write path against the CPU reference.
//
// SET_ROWS (f32 and f16 sources) and CPY into turbo4/turbo3/turbo2 and their 64-value forms (turbo4_64/turbo3_64/
// turbo2_64, one warp per 64-block, cuda/turbo.cu's kernels) are computed on CUDA0 through ggml-backend;
// every written block is compared byte for byte with ggml_quantize_chunk (= quantize_row_turbo*_ref, *_64_ref).
// GET_ROWS back to f32 on CUDA0 is compared bit for bit with the type's to_float (dequantize_row_turbo*).
// Rows cover normal, uniform, large (> 2^32, the rescaled path), small (FP16-subnormal norms), constant,
// sparse, Hadamard-like, zero, NaN and Inf inputs. The recent window's ring (ggml_set_rows_ring): the q8_0 rows of the
// rotated rows (turbo destinations; the bulk and the warp kernel) are compared byte for byte with the CPU backend's (the
// reference), an f16 cache's ring rows with the rows it stored. Exit status 0 only if every byte matches.
//
// build: g++ -O2 -std=c++17 test-turbo-cuda.cpp -I<tree>/ggml/include -L<build>/bin -lggml -lggml-base -lggml-cpu -lggml-cuda
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cuda.h"
#include "ggml-cpu.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <random>
#include <vector>

// ggml's q8_0 block (ggml-common.h is not a public header)
#define QK8_0 32
struct block_q8_0 { ggml_fp16_t d; int8_t qs[QK8_0]; };

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

// SET_ROWS with a ring on backend be: NROWS rows of x into a [NCOLS, RING_KV*RING_NS] cache at rows perm, ring
// [NCOLS, RING_R, RING_NS] (q8_0 for a turbo type, else the type); the ring's bytes into ring_out
static const int RING_KV = 600, RING_NS = 2, RING_R = 300;
static bool ring_compute(ggml_backend_t be, ggml_type type, ggml_type src_type, const std::vector<float> & x,
        const std::vector<int64_t> & perm, std::vector<uint8_t> & ring_out, std::vector<uint8_t> & dst_out) {
    ggml_init_params ip = { 8*ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    const ggml_type rtype = ggml_is_turbo(type) ? GGML_TYPE_Q8_0 : type;
    ggml_tensor * src  = ggml_new_tensor_2d(ctx, src_type, NCOLS, NROWS);
    ggml_tensor * idx  = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, NROWS);
    ggml_tensor * dst  = ggml_new_tensor_2d(ctx, type, NCOLS, RING_KV*RING_NS);
    ggml_tensor * ring = ggml_new_tensor_3d(ctx, rtype, NCOLS, RING_R, RING_NS);
    ggml_tensor * out  = ggml_set_rows(ctx, dst, src, idx);
    ggml_set_rows_ring(out, ring);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
    ggml_backend_buffer_clear(buf, 0);   // the cache and the ring start as zeros on both backends
    ggml_backend_tensor_set(idx, perm.data(), 0, ggml_nbytes(idx));
    if (src_type == GGML_TYPE_F32) {
        ggml_backend_tensor_set(src, x.data(), 0, ggml_nbytes(src));
    } else {
        std::vector<ggml_fp16_t> h(x.size());
        ggml_fp32_to_fp16_row(x.data(), h.data(), (int64_t) x.size());
        ggml_backend_tensor_set(src, h.data(), 0, ggml_nbytes(src));
    }
    const bool ok = ggml_backend_graph_compute(be, gf) == GGML_STATUS_SUCCESS;
    ring_out.resize(ggml_nbytes(ring));
    ggml_backend_tensor_get(ring, ring_out.data(), 0, ring_out.size());
    dst_out.resize(ggml_nbytes(dst));
    ggml_backend_tensor_get(dst, dst_out.data(), 0, dst_out.size());
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return ok;
}

static int run_ring_case(ggml_backend_t be, ggml_backend_t cpu, ggml_type type, ggml_type src_type, std::mt19937 & rng) {
    std::vector<float> x((size_t) NROWS*NCOLS);
    fill_rows(x, rng);
    // NROWS distinct cells of the streams whose ring rows (stream, cell % R) are distinct too (a ring row written twice
    // may hold either row)
    std::vector<int64_t> all(RING_KV*RING_NS), perm;
    for (int i = 0; i < RING_KV*RING_NS; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<bool> used(RING_R*RING_NS, false);
    for (int64_t c : all) {
        const int64_t slot = (c / RING_KV)*RING_R + (c % RING_KV) % RING_R;
        if (!used[slot] && (int) perm.size() < NROWS) {
            used[slot] = true;
            perm.push_back(c);
        }
    }
    std::vector<uint8_t> got, ref, got_dst, ref_dst;
    if (!ring_compute(be, type, src_type, x, perm, got, got_dst) || !ring_compute(cpu, type, src_type, x, perm, ref, ref_dst)) {
        fprintf(stderr, "graph compute failed\n");
        return 1;
    }
    const ggml_type rtype = ggml_is_turbo(type) ? GGML_TYPE_Q8_0 : type;
    const size_t row_size = ggml_row_size(rtype, NCOLS);
    int rows_bad = 0, skipped = 0;
    if (rtype == GGML_TYPE_Q8_0) {
        // each ring row against the CPU backend's, block by block, except where the reference's scale is not finite
        // (NaN or Inf in the rotated block, or amax/127 past FP16: how MAX folds NaNs and how NaN converts to int8 are
        // not the format's)
        for (size_t r = 0; r < got.size()/row_size; ++r) {
            const block_q8_0 * g = (const block_q8_0 *) (got.data() + r*row_size);
            const block_q8_0 * c = (const block_q8_0 *) (ref.data() + r*row_size);
            bool ok = true;
            for (int b = 0; b < NCOLS/QK8_0; ++b) {
                if (!std::isfinite(ggml_fp16_to_fp32(c[b].d))) {
                    skipped++;
                } else if (memcmp(&g[b], &c[b], sizeof(block_q8_0)) != 0) {
                    ok = false;
                }
            }
            if (!ok && rows_bad++ < 3) {
                fprintf(stderr, "  ring row %zu differs\n", r);
            }
        }
    } else {
        // a plain cache's ring holds its rows as stored: each written ring row against the CUDA cache's own row (the
        // f32 -> f16 conversion of out-of-range and NaN inputs is upstream's, not the CPU's bit for bit)
        for (int64_t c : perm) {
            const int64_t slot = (c / RING_KV)*RING_R + (c % RING_KV) % RING_R;
            if (memcmp(got.data() + slot*row_size, got_dst.data() + c*row_size, row_size) != 0 && rows_bad++ < 3) {
                fprintf(stderr, "  ring row %lld differs from cache row %lld\n", (long long) slot, (long long) c);
            }
        }
    }
    const int n_cmp = rtype == GGML_TYPE_Q8_0 ? (int) (got.size()/row_size) : (int) perm.size();
    printf("BITEXACT %-9s %-8s src %-3s rows %3d: ring (%s) %d/%d rows identical to %s (%d blocks of non-finite scale "
        "skipped)\n", ggml_type_name(type), "RING", ggml_type_name(src_type), NROWS, ggml_type_name(rtype), n_cmp - rows_bad,
        n_cmp, rtype == GGML_TYPE_Q8_0 ? "the CPU backend's" : "the cache's rows", skipped);
    return rows_bad == 0 ? 0 : 1;
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
    ggml_backend_t cpu = ggml_backend_cpu_init();
    for (int rows : { 512, 48 }) {
        NROWS = rows;
        for (ggml_type type : { GGML_TYPE_TURBO4, GGML_TYPE_TURBO3, GGML_TYPE_TURBO2,
                                GGML_TYPE_TURBO4_64, GGML_TYPE_TURBO3_64, GGML_TYPE_TURBO2_64 }) {
            for (ggml_type st : { GGML_TYPE_F32, GGML_TYPE_F16 }) {
                fails += run_ring_case(be, cpu, type, st, rng);
            }
        }
        // (an f16 cache's ring: the rows as stored; a q8_0 cache's rows are upstream's encoding, its own test's)
        fails += run_ring_case(be, cpu, GGML_TYPE_F16, GGML_TYPE_F32, rng);
    }
    ggml_backend_free(cpu);
    printf("BITEXACT %s (%d failing cases)\n", fails == 0 ? "PASS" : "FAIL", fails);
    ggml_backend_free(be);
    return fails == 0 ? 0 : 1;
}
