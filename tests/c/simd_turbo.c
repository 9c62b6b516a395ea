// The attention helpers' AVX2+FMA path against the plain C path (tests/test_format.py runs this program
// twice, with and without TURBO_NO_SIMD=1, and compares): the V accumulation (mad) must give the same bits,
// the K dot the same value up to the summation order. Within each path, the GQA helpers (several query heads
// from one read of the codes) must give every head's single-head result bit for bit.
#include "ggml-turbo.c"

#include "simd_test_util.h"

int main(void) {
    rnd_seed(12345u);
    static float x[K], q[K], acc3[K], acc2[K];
    static block_turbo3 b3[NB];
    static block_turbo2 b2[NB];
    for (int i = 0; i < K; i++) {
        x[i] = rnd()*(1.0f + (float) (i % 7));
        q[i] = rnd();
    }
    quantize_row_turbo3_ref(x, b3, K);
    quantize_row_turbo2_ref(x, b2, K);
    print_simd_path();
    for (int r = 0; r < NB; r++) {
        printf("dot3 %d %.9e\n", r, turbo3_dot_rotated(b3 + r, q + r*QK_TURBO, QK_TURBO));
        printf("dot2 %d %.9e\n", r, turbo2_dot_rotated(b2 + r, q + r*QK_TURBO, QK_TURBO));
    }
    printf("dot3 all %.9e\ndot2 all %.9e\n", turbo3_dot_rotated(b3, q, K), turbo2_dot_rotated(b2, q, K));
    for (int t = 0; t < 8; t++) {
        const float w = 0.125f + 0.37f*(float) t;
        turbo3_mad_rotated(b3, acc3, w, K);
        turbo2_mad_rotated(b2, acc2, w, K);
    }
    printf("mad3 %016llx\nmad2 %016llx\n", (unsigned long long) fnv(acc3, sizeof(acc3)), (unsigned long long) fnv(acc2, sizeof(acc2)));

    // GQA helpers: nq heads from one read of the codes give each head's single-head result bit for bit
    // (rows of 2 blocks, as Gemma 3's head_dim 256; query heads at a stride of 256)
    int gqa_ok = 1;
    static float acc_one[TURBO_MAX_GQA*2*QK_TURBO], acc_gqa[TURBO_MAX_GQA*2*QK_TURBO];
    const int nqs[] = {1, 2, 3, 4, 5, 8, 16};
    for (int bits = 2; bits <= 3; bits++) {
        for (size_t in = 0; in < sizeof(nqs)/sizeof(nqs[0]); in++) {
            const int nq = nqs[in];
            for (int r = 0; r + 2 <= NB; r += 2) {
                const void * row = bits == 3 ? (const void *) (b3 + r) : (const void *) (b2 + r);
                float out[TURBO_MAX_GQA], w[TURBO_MAX_GQA];
                turbo_dot_rotated_gqa(bits, row, q, 2*QK_TURBO, nq, out, 2*QK_TURBO);
                for (int h = 0; h < nq; h++) {
                    const float one = bits == 3 ? turbo3_dot_rotated((const block_turbo3 *) row, q + h*2*QK_TURBO, 2*QK_TURBO)
                                                : turbo2_dot_rotated((const block_turbo2 *) row, q + h*2*QK_TURBO, 2*QK_TURBO);
                    if (memcmp(&one, &out[h], sizeof(float)) != 0) {
                        printf("gqa-dot-mismatch bits=%d nq=%d row=%d head=%d\n", bits, nq, r, h);
                        gqa_ok = 0;
                    }
                    w[h] = 0.03f + 0.11f*(float) ((h + r) % 9);
                    if (bits == 3) turbo3_mad_rotated((const block_turbo3 *) row, acc_one + h*2*QK_TURBO, w[h], 2*QK_TURBO);
                    else           turbo2_mad_rotated((const block_turbo2 *) row, acc_one + h*2*QK_TURBO, w[h], 2*QK_TURBO);
                }
                turbo_mad_rotated_gqa(bits, row, acc_gqa, 2*QK_TURBO, w, nq, 2*QK_TURBO);
            }
            if (memcmp(acc_one, acc_gqa, sizeof(acc_one)) != 0) {
                printf("gqa-mad-mismatch bits=%d nq=%d\n", bits, nq);
                gqa_ok = 0;
            }
        }
    }
    printf("gqa %d\n", gqa_ok);
    return 0;
}
