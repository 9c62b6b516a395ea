// What the SIMD test programs (simd_turbo.c, simd_turbo4.c) share: the sizes, a seeded generator of about-normal
// values, a hash of result bits, and the line that says which path ran. Each program is run twice (TURBO_NO_SIMD=1
// and 0) and its output lines are compared, so both paths must see the same inputs: the generator is seeded in main.
// Included after ggml-turbo.c (QK_TURBO, TURBO_AVX2, turbo_use_avx2).
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum { NB = 64, K = NB*QK_TURBO };

static uint32_t rng;

static void rnd_seed(uint32_t seed) {
    rng = seed;
}

static float rnd(void) {   // about N(0, 1): a sum of 4 uniforms
    float s = 0.0f;
    for (int i = 0; i < 4; i++) {
        rng = rng*1664525u + 1013904223u;
        s += (float) (rng >> 8) / 16777216.0f - 0.5f;
    }
    return s*1.7320508f;
}

static uint64_t fnv(const void * p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ ((const uint8_t *) p)[i])*1099511628211ull;
    }
    return h;
}

// "simd 1" when the AVX2+FMA helpers run (compiled in and picked at run time), "simd 0" for the plain C path
static void print_simd_path(void) {
#ifdef TURBO_AVX2
    printf("simd %d\n", turbo_use_avx2());
#else
    printf("simd 0\n");
#endif
}
