// turbo-llama: the decode split merge alone, on a CUDA GPU: k_turbo_fattn_combine_warp (the default merge) and
// k_turbo_fattn_combine_par (from 8 splits up) on the same random partials, at the split counts of the llama8b
// decode (4 splits at depth 0, 49 at 32K-128K with v14) and of the 32K test case (128): the largest difference
// from a double-precision merge on the host (no rotation: V_turbo = false), the largest difference between the
// two kernels with the rotation, and the time per launch (CUDA events over a CUDA graph of 200 launches).
// Build and run: cuda/host-check/combine_bench.sh <prepared llama.cpp tree> (needs nvcc and a GPU).
#include "fattn-turbo.cuh"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

constexpr int D = 128, NCOLS = 8, HKV = 8, GQA = 4, NHEAD = HKV*GQA, NQ = 1;

struct partials {
    std::vector<float>  acc;    // slots x NCOLS x D
    std::vector<float2> meta;   // slots x NCOLS
};

// the rows of a split that saw no key carry (-inf, 0) and zero values, as the attention kernel writes them
static partials make_partials(const int n_split, std::mt19937 & rng) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    partials p;
    const size_t slots = (size_t) HKV*n_split;
    p.acc.resize(slots*NCOLS*D);
    p.meta.resize(slots*NCOLS);
    for (size_t i = 0; i < slots*NCOLS; ++i) {
        const bool empty = (rng() % 7) == 0;
        const float sum = 1.0f + 50.0f*(0.5f + 0.5f*u(rng));
        p.meta[i] = empty ? make_float2(-INFINITY, 0.0f) : make_float2(4.0f*u(rng), sum);
        for (int d = 0; d < D; ++d) {
            p.acc[i*D + d] = empty ? 0.0f : sum*u(rng);
        }
    }
    return p;
}

// dst row (j = 0, head h) of KV head hk, group row r, merged in double
static void host_merge(const partials & p, const int n_split, const float * sinks, std::vector<double> & out) {
    out.assign((size_t) NHEAD*D, 0.0);
    for (int hk = 0; hk < HKV; ++hk) {
        for (int r = 0; r < GQA; ++r) {
            const int h = hk*GQA + r;
            double M = sinks ? sinks[h] : -INFINITY;
            for (int s = 0; s < n_split; ++s) {
                M = std::max(M, (double) p.meta[((size_t) hk*n_split + s)*NCOLS + r].x);
            }
            if (M == -INFINITY) {
                continue;
            }
            double S = sinks ? std::exp(sinks[h] - M) : 0.0;
            std::vector<double> a(D, 0.0);
            for (int s = 0; s < n_split; ++s) {
                const size_t slot = ((size_t) hk*n_split + s)*NCOLS + r;
                if (p.meta[slot].x == -INFINITY) {
                    continue;
                }
                const double f = std::exp(p.meta[slot].x - M);
                S += p.meta[slot].y*f;
                for (int d = 0; d < D; ++d) {
                    a[d] += p.acc[slot*D + d]*f;
                }
            }
            for (int d = 0; d < D; ++d) {
                out[(size_t) h*D + d] = S > 0.0 ? a[d]/S : 0.0;
            }
        }
    }
}

template <bool V_turbo>
static void launch_one(const int which, const float * acc, const float2 * meta, const float * sinks, float * dst, const int n_split,
        cudaStream_t stream) {
    const dim3 grid(NCOLS, HKV, 1);
    if (which == 1) {
        k_turbo_fattn_combine_warp<D, QK_TURBO, V_turbo, NCOLS><<<grid, D/4, 0, stream>>>(acc, meta, sinks, dst, n_split, 1, GQA, NQ, NHEAD);
    } else {
        k_turbo_fattn_combine_par<D, QK_TURBO, V_turbo, NCOLS><<<grid, TURBO_COMBINE_WARPS*WARP_SIZE, 0, stream>>>(acc, meta, sinks, dst,
            n_split, 1, GQA, NQ, NHEAD);
    }
}

// reps = 0: one launch; else the mean time of a launch inside a CUDA graph of reps launches (so that the host's
// launch rate does not set the time of a few-microsecond kernel), over 10 replays after a warm-up replay
template <bool V_turbo>
static float launch(const int which, const float * acc, const float2 * meta, const float * sinks, float * dst, const int n_split,
        const int reps) {
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    if (reps == 0) {
        launch_one<V_turbo>(which, acc, meta, sinks, dst, n_split, stream);
        CHECK(cudaStreamSynchronize(stream));
        CHECK(cudaGetLastError());
        CHECK(cudaStreamDestroy(stream));
        return 0.0f;
    }
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < reps; ++i) {
        launch_one<V_turbo>(which, acc, meta, sinks, dst, n_split, stream);
    }
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, nullptr, nullptr, 0));
    CHECK(cudaGraphLaunch(exec, stream));   // warm-up
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    CHECK(cudaEventRecord(e0, stream));
    for (int i = 0; i < 10; ++i) {
        CHECK(cudaGraphLaunch(exec, stream));
    }
    CHECK(cudaEventRecord(e1, stream));
    CHECK(cudaEventSynchronize(e1));
    CHECK(cudaGetLastError());
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaStreamDestroy(stream));
    return 1000.0f*ms/(10.0f*reps);
}

int main() {
    std::mt19937 rng(42);
    int failures = 0;
    std::vector<float> sinks_h(NHEAD);
    for (int h = 0; h < NHEAD; ++h) {
        sinks_h[h] = -2.0f + 0.1f*h;
    }
    float * sinks_d;
    CHECK(cudaMalloc(&sinks_d, NHEAD*sizeof(float)));
    CHECK(cudaMemcpy(sinks_d, sinks_h.data(), NHEAD*sizeof(float), cudaMemcpyHostToDevice));
    for (const int n_split : { 1, 4, 13, 49, 64, 65, 128 }) {
        const partials p = make_partials(n_split, rng);
        float * acc; float2 * meta; float * dst1; float * dst2;
        CHECK(cudaMalloc(&acc, p.acc.size()*sizeof(float)));
        CHECK(cudaMalloc(&meta, p.meta.size()*sizeof(float2)));
        CHECK(cudaMalloc(&dst1, (size_t) NHEAD*D*sizeof(float)));
        CHECK(cudaMalloc(&dst2, (size_t) NHEAD*D*sizeof(float)));
        CHECK(cudaMemcpy(acc, p.acc.data(), p.acc.size()*sizeof(float), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(meta, p.meta.data(), p.meta.size()*sizeof(float2), cudaMemcpyHostToDevice));
        for (const bool with_sinks : { false, true }) {
            const float * sk = with_sinks ? sinks_d : nullptr;
            std::vector<double> ref;
            host_merge(p, n_split, with_sinks ? sinks_h.data() : nullptr, ref);
            std::vector<float> o1((size_t) NHEAD*D), o2((size_t) NHEAD*D);
            launch<false>(1, acc, meta, sk, dst1, n_split, 0);
            launch<false>(2, acc, meta, sk, dst2, n_split, 0);
            CHECK(cudaMemcpy(o1.data(), dst1, o1.size()*sizeof(float), cudaMemcpyDeviceToHost));
            CHECK(cudaMemcpy(o2.data(), dst2, o2.size()*sizeof(float), cudaMemcpyDeviceToHost));
            double e1 = 0.0, e2 = 0.0, scale = 0.0;
            for (size_t i = 0; i < ref.size(); ++i) {
                e1 = std::max(e1, std::fabs(o1[i] - ref[i]));
                e2 = std::max(e2, std::fabs(o2[i] - ref[i]));
                scale = std::max(scale, std::fabs(ref[i]));
            }
            launch<true>(1, acc, meta, sk, dst1, n_split, 0);
            launch<true>(2, acc, meta, sk, dst2, n_split, 0);
            CHECK(cudaMemcpy(o1.data(), dst1, o1.size()*sizeof(float), cudaMemcpyDeviceToHost));
            CHECK(cudaMemcpy(o2.data(), dst2, o2.size()*sizeof(float), cudaMemcpyDeviceToHost));
            double e12 = 0.0;
            for (size_t i = 0; i < o1.size(); ++i) {
                e12 = std::max(e12, (double) std::fabs(o1[i] - o2[i]));
            }
            const float t1 = launch<true>(1, acc, meta, sk, dst1, n_split, 200);
            const float t2 = launch<true>(2, acc, meta, sk, dst2, n_split, 200);
            const bool ok = e1 <= 1e-5*scale && e2 <= 1e-5*scale && e12 <= 1e-5*scale;
            failures += ok ? 0 : 1;
            printf("splits %3d sinks %d | max |ref| %.3f | max err warp %.2e par %.2e | rotated warp-par %.2e | "
                   "us per launch: warp %.2f par %.2f | %s\n", n_split, (int) with_sinks, scale, e1, e2, e12, t1, t2,
                   ok ? "ok" : "FAIL");
        }
        CHECK(cudaFree(acc)); CHECK(cudaFree(meta)); CHECK(cudaFree(dst1)); CHECK(cudaFree(dst2));
    }
    printf("COMBINE %s (%d failing cases)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
