// What the programs linked against the built ggml share: ggml_roundtrip.c and ggml_validate.c (C) the type named
// on the command line; cell0_attention.cpp and window_attention.cpp (C++) also a row read back as floats.
#pragma once

#include "ggml.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The ggml type whose name is `name` (e.g. "turbo4"), or GGML_TYPE_COUNT after saying on stderr that there is none.
static enum ggml_type ggml_type_from_name(const char * name) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char * tn = ggml_type_name((enum ggml_type) t);
        if (tn && strcmp(tn, name) == 0) {
            return (enum ggml_type) t;
        }
    }
    fprintf(stderr, "unknown type %s\n", name);
    return GGML_TYPE_COUNT;
}

#ifdef __cplusplus
#include <vector>

// a ggml type by its name (exits on an unknown one)
static ggml_type type_named(const char * name) {
    const ggml_type type = ggml_type_from_name(name);
    if (type == GGML_TYPE_COUNT) {
        exit(2);
    }
    return type;
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
#endif
