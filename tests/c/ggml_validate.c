// Runs the BUILT ggml's ggml_validate_row_data on each row of a file, so that a test can check that the
// bindings' rule for invalid turbo blocks is ggml's. Usage: ggml_validate TYPE_NAME ROW_BYTES IN
// Prints one line per row: 1 (valid) or 0 (invalid).
#include "ggml_test_util.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char ** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s TYPE ROW_BYTES IN\n", argv[0]);
        return 2;
    }
    const enum ggml_type type = ggml_type_from_name(argv[1]);
    if (type == GGML_TYPE_COUNT) {
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
