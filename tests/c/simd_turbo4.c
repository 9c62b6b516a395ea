// turbo4's attention helpers: the AVX2+FMA path (a 16-entry table as two permutes and a blend) against the
// plain C path, run twice by tests/test_turbo4.py (TURBO_NO_SIMD=1 and 0) and compared: the V accumulation
// (mad) the same bits, the K dot the same value up to the summation order. Within each path the GQA helpers
// give every head's single-head result bit for bit, and the dot equals the dot with the decoded block.
#include "ggml-turbo.c"

#include "simd_test_util.h"

int main(void) {
    rnd_seed(4242u);
    static float x[K], q[K], acc[K], dec[K], qr[K];
    static block_turbo4 b[NB];
    for (int i = 0; i < K; i++) {
        x[i] = rnd()*(1.0f + (float) (i % 7));
        q[i] = rnd();
    }
    quantize_row_turbo4_ref(x, b, K);
    print_simd_path();
    // every code value occurs (a table half or a blend mask wrong would show)
    int seen[16] = {0};
    for (int i = 0; i < K; i++) {
        seen[turbo4_code(b[i / QK_TURBO].qs, i % QK_TURBO)] = 1;
    }
    int all = 1;
    for (int c = 0; c < 16; c++) all &= seen[c];
    printf("codes %d\n", all);

    // <q, decode(b)> two ways: the rotated-domain dot against q (H D q), and the decoded block against q
    memcpy(qr, q, sizeof(q));
    turbo_rotate_forward(qr, K);
    dequantize_row_turbo4(b, dec, K);
    double worst = 0.0;
    for (int r = 0; r < NB; r++) {
        const float d = turbo4_dot_rotated(b + r, qr + r*QK_TURBO, QK_TURBO);
        double ref = 0.0, scale = 0.0;
        for (int i = 0; i < QK_TURBO; i++) {
            ref   += (double) dec[r*QK_TURBO + i] * q[r*QK_TURBO + i];
            scale += fabs((double) dec[r*QK_TURBO + i] * q[r*QK_TURBO + i]);
        }
        const double err = fabs(d - ref) / (scale + 1e-30);
        worst = err > worst ? err : worst;
        printf("dot4 %d %.9e\n", r, d);
    }
    printf("dot_vs_decoded %d\n", worst < 1e-5);
    for (int t = 0; t < 8; t++) {
        turbo4_mad_rotated(b, acc, 0.125f + 0.37f*(float) t, K);
    }
    printf("mad4 %016llx\n", (unsigned long long) fnv(acc, sizeof(acc)));

    int gqa_ok = 1;
    static float acc_one[TURBO_MAX_GQA*2*QK_TURBO], acc_gqa[TURBO_MAX_GQA*2*QK_TURBO];
    const int nqs[] = {1, 2, 3, 4, 5, 8, 16};
    for (size_t in = 0; in < sizeof(nqs)/sizeof(nqs[0]); in++) {
        const int nq = nqs[in];
        for (int r = 0; r + 2 <= NB; r += 2) {
            float out[TURBO_MAX_GQA], w[TURBO_MAX_GQA];
            turbo_dot_rotated_gqa(4, b + r, q, 2*QK_TURBO, nq, out, 2*QK_TURBO);
            for (int h = 0; h < nq; h++) {
                const float one = turbo4_dot_rotated(b + r, q + h*2*QK_TURBO, 2*QK_TURBO);
                if (memcmp(&one, &out[h], sizeof(float)) != 0) {
                    printf("gqa-dot-mismatch nq=%d row=%d head=%d\n", nq, r, h);
                    gqa_ok = 0;
                }
                w[h] = 0.03f + 0.11f*(float) ((h + r) % 9);
                turbo4_mad_rotated(b + r, acc_one + h*2*QK_TURBO, w[h], 2*QK_TURBO);
            }
            turbo_mad_rotated_gqa(4, b + r, acc_gqa, 2*QK_TURBO, w, nq, 2*QK_TURBO);
        }
        if (memcmp(acc_one, acc_gqa, sizeof(acc_one)) != 0) {
            printf("gqa-mad-mismatch nq=%d\n", nq);
            gqa_ok = 0;
        }
    }
    printf("gqa %d\n", gqa_ok);
    return 0;
}
