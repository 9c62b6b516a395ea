// Runs the BUILT ggml's ggml_validate_row_data on each row of a file, so that a test can check that the
// bindings' rule for invalid turbo blocks is ggml's. Usage: ggml_validate TYPE_NAME ROW_BYTES IN
// Prints one line per row: 1 (valid) or 0 (invalid).
#include "ggml.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char ** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s TYPE ROW_BYTES IN\n", argv[0]);
        return 2;
    }
    enum ggml_type type = GGML_TYPE_COUNT;
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char * name = ggml_type_name((enum ggml_type) t);
        if (name && strcmp(name, argv[1]) == 0) {
            type = (enum ggml_type) t;
        }
    }
    if (type == GGML_TYPE_COUNT) {
        fprintf(stderr, "unknown type %s\n", argv[1]);
        return 2;
    }
    const long row_bytes = atol(argv[2]);
    if (row_bytes <= 0) {
        fprintf(stderr, "bad row size %s\n", argv[2]);
        return 2;
    }
    FILE * f = fopen(argv[3], "rb");
    if (!f) {
        fprintf(stderr, "cannot read %s\n", argv[3]);
        return 1;
    }
    unsigned char * row = malloc(row_bytes);
    while (fread(row, 1, row_bytes, f) == (size_t) row_bytes) {
        printf("%d\n", ggml_validate_row_data(type, row, row_bytes) ? 1 : 0);
    }
    fclose(f);
    free(row);
    return 0;
}
