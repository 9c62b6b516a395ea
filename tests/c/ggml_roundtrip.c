// Quantizes rows with the BUILT ggml (ggml_quantize_chunk + the type's to_float) so that a test can
// compare its bytes with turbo_llama's bindings. Usage: ggml_roundtrip TYPE_NAME NROWS N_PER_ROW IN OUT_Q OUT_F
#include "ggml_test_util.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char ** argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s TYPE NROWS N_PER_ROW IN.f32 OUT.q OUT.f32\n", argv[0]);
        return 2;
    }
    const enum ggml_type type = ggml_type_from_name(argv[1]);
    if (type == GGML_TYPE_COUNT) {
        return 2;
    }
    const long nrows = atol(argv[2]), n = atol(argv[3]);
    float * x = malloc(sizeof(float) * nrows * n);
    float * y = malloc(sizeof(float) * nrows * n);
    const size_t qbytes = ggml_row_size(type, n) * nrows;
    void * q = malloc(qbytes);
    FILE * f = fopen(argv[4], "rb");
    if (!f || fread(x, sizeof(float), nrows * n, f) != (size_t) (nrows * n)) {
        fprintf(stderr, "cannot read %s\n", argv[4]);
        return 1;
    }
    fclose(f);
    const size_t written = ggml_quantize_chunk(type, x, q, 0, nrows, n, NULL);
    ggml_get_type_traits(type)->to_float(q, y, nrows * n);
    f = fopen(argv[5], "wb"); fwrite(q, 1, written, f); fclose(f);
    f = fopen(argv[6], "wb"); fwrite(y, sizeof(float), nrows * n, f); fclose(f);
    printf("%s %zu bytes\n", ggml_type_name(type), written);
    return written == qbytes ? 0 : 1;
}
