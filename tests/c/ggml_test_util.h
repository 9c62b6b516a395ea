// Helpers shared by the ggml-level test programs of tests/c/ (cell0_attention.cpp, window_attention.cpp).
#pragma once

#include "ggml.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

// a ggml type by its name (exits on an unknown one)
static ggml_type type_named(const char * name) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char * tn = ggml_type_name((ggml_type) t);
        if (tn && strcmp(tn, name) == 0) {
            return (ggml_type) t;
        }
    }
    fprintf(stderr, "unknown type %s\n", name);
    exit(2);
}

// one row of n values of a type with to_float (f32 copied) as floats
static std::vector<float> row_f32(ggml_type type, const char * row, int64_t n) {
    std::vector<float> out(n);
    if (type == GGML_TYPE_F32) {
        memcpy(out.data(), row, n*sizeof(float));
    } else {
        ggml_get_type_traits(type)->to_float(row, out.data(), n);
    }
    return out;
}
