// Exercises cpu_ref/ggml-turbo.c under AddressSanitizer + UBSan (tests/test_hostile.py builds it):
// random bytes through every decoder, hostile floats through every encoder, exact-size buffers
// on the heap so that any read or write past a row is reported.
#include "ggml-turbo.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned long long rng_state = 0x9E3779B97F4A7C15ull;
static unsigned rnd(void) {
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (unsigned) (rng_state >> 11);
}

static float hostile(void) {
    switch (rnd() % 8) {
        case 0:  return NAN;
        case 1:  return INFINITY;
        case 2:  return -INFINITY;
        case 3:  return 1e30f * ((rnd() & 1) ? 1 : -1);
        case 4:  return 1e-40f;
        case 5:  return 0.0f;
        default: return ((float) (rnd() % 20001) - 10000.0f) / 1000.0f;
    }
}

int main(void) {
    int bad = 0;
    for (int iter = 0; iter < 2000; iter++) {
        const int nblocks = 1 + (int) (rnd() % 4);
        const int k = nblocks * QK_TURBO;
        float * x = malloc(sizeof(float) * k);
        float * y = malloc(sizeof(float) * k);
        block_turbo3 * q3 = malloc(sizeof(block_turbo3) * nblocks);
        block_turbo2 * q2 = malloc(sizeof(block_turbo2) * nblocks);
        block_turbo4 * q4 = malloc(sizeof(block_turbo4) * nblocks);
        // random bytes, including Inf/NaN norms: decoding must stay in bounds
        for (size_t i = 0; i < sizeof(block_turbo3) * nblocks; i++) ((unsigned char *) q3)[i] = (unsigned char) rnd();
        for (size_t i = 0; i < sizeof(block_turbo2) * nblocks; i++) ((unsigned char *) q2)[i] = (unsigned char) rnd();
        for (size_t i = 0; i < sizeof(block_turbo4) * nblocks; i++) ((unsigned char *) q4)[i] = (unsigned char) rnd();
        dequantize_row_turbo3(q3, y, k);
        dequantize_row_turbo2(q2, y, k);
        dequantize_row_turbo4(q4, y, k);
        turbo3_validate_row(q3, sizeof(block_turbo3) * nblocks);
        turbo2_validate_row(q2, sizeof(block_turbo2) * nblocks);
        turbo4_validate_row(q4, sizeof(block_turbo4) * nblocks);
        // hostile floats: encoding must never store a non-finite norm
        for (int i = 0; i < k; i++) x[i] = hostile();
        quantize_row_turbo3_ref(x, q3, k);
        quantize_row_turbo2_ref(x, q2, k);
        quantize_row_turbo4_ref(x, q4, k);
        bad += !turbo3_validate_row(q3, sizeof(block_turbo3) * nblocks);
        bad += !turbo2_validate_row(q2, sizeof(block_turbo2) * nblocks);
        bad += !turbo4_validate_row(q4, sizeof(block_turbo4) * nblocks);
        dequantize_row_turbo4(q4, y, k);
        for (int i = 0; i < k; i++) bad += !isfinite(y[i]);
        dequantize_row_turbo3(q3, y, k);
        for (int i = 0; i < k; i++) bad += !isfinite(y[i]);
        float s;
        ggml_vec_dot_turbo3_f32(k, &s, 0, q3, 0, y, 0, 1);
        ggml_vec_dot_turbo2_f32(k, &s, 0, q2, 0, y, 0, 1);
        ggml_vec_dot_turbo4_f32(k, &s, 0, q4, 0, y, 0, 1);
        free(x); free(y); free(q3); free(q2); free(q4);
    }
    printf("sanitize_turbo: %s (%d bad)\n", bad ? "FAIL" : "ok", bad);
    return bad != 0;
}
