#!/usr/bin/env bash
# The 2-threads-per-block KV write (cuda/turbo-encode-t2.cuh, the default for large writes) compiled as host code,
# each block's pair of threads emulated, against the C reference encoder (cpu_ref/ggml-turbo.c, compiled in).
# Needs only g++; prints PASS or FAIL last.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
python3 - "$here/../turbo-common.cuh" "$tmp" <<'PY'
import sys
c = open(sys.argv[1]).read()
i = c.index('#define TURBO_CUDA_SIGN_WORDS'); j = c.index('static __device__ __constant__ float turbo_d_c3')
open(sys.argv[2] + '/turbo_consts.inc', 'w').write(c[i:j])
i = c.index('// ---- encode helpers shared'); j = c.index('// ---- end of the encode helpers')
open(sys.argv[2] + '/turbo_helpers.inc', 'w').write(c[i:j])
PY
gcc -O1 -std=c11 -ffp-contract=off -c "$here/../../cpu_ref/ggml-turbo.c" -I"$here/../../cpu_ref" -o "$tmp/ggml-turbo.o"
g++ -O1 -std=c++20 -ffp-contract=off "$here/set_rows_t2_check.cpp" "$tmp/ggml-turbo.o" -I"$tmp" -I"$here/.." \
    -I"$here/../../cpu_ref" -lpthread -lm -o "$tmp/t2_check"
"$tmp/t2_check"
rm -rf "$tmp"
