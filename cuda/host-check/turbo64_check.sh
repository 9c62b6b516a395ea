#!/usr/bin/env bash
# The 64-value blocks' warp helpers (cuda/turbo-common.cuh: the encoder, the packing, the decoders, the rotations, the
# codebooks and the 64-point FWHT, which turbo.cu's writes and reads and the attention kernels use)
# compiled as host code, the warp's 32 lanes emulated by 32 threads meeting at a barrier for every shuffle, vote and
# ballot, against the C reference (cpu_ref/ggml-turbo.c, compiled in). Needs only g++; prints PASS or FAIL last.
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
i = c.index('#define TURBO64_CUDA_C3'); j = c.index('static __device__ __constant__ float turbo64_d_c3')
open(sys.argv[2] + '/turbo64_consts.inc', 'w').write(c[i:j])
i = c.index('// ---- the 64-point FWHT'); j = c.index('// ---- end of the 64-point FWHT')
f = c[i:j]
i = c.index('// ---- the block in one warp'); j = c.index('// ---- end of the warp helpers')
open(sys.argv[2] + '/turbo64_helpers.inc', 'w').write(f + c[i:j])
PY
gcc -O1 -std=c11 -ffp-contract=off -c "$here/../../cpu_ref/ggml-turbo.c" -I"$here/../../cpu_ref" -o "$tmp/ggml-turbo.o"
g++ -O1 -std=c++20 -ffp-contract=off "$here/turbo64_check.cpp" "$tmp/ggml-turbo.o" -I"$tmp" -I"$here" \
    -I"$here/../../cpu_ref" -lpthread -lm -o "$tmp/turbo64_check"
"$tmp/turbo64_check"
rm -rf "$tmp"
