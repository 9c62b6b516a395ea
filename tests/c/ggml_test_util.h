// What the programs linked against the built ggml (ggml_roundtrip.c, ggml_validate.c) share: the type named on
// the command line.
#pragma once

#include "ggml.h"

#include <stdio.h>
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
