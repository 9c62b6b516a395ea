#!/usr/bin/env bash
# The 4-threads-per-block KV write (turbo_t4_* in cuda/turbo.cu) compiled as host code, a warp emulated
# with threads, against the C reference encoder (cpu_ref/). Needs the CPU build of turbo-llama (ggml for fp16).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=${TURBO_LLAMA_SRC:-$HOME/.cache/turbo-llama/src/llama.cpp}
bld=${TURBO_LLAMA_BUILD:-$HOME/.cache/turbo-llama/build/cpu}
tmp=$(mktemp -d)
python3 - "$here/../turbo.cu" "$here/../turbo-common.cuh" "$tmp" <<'PY'
import re, sys
s = open(sys.argv[1]).read()
a = s.index('// one FWHT stage across the group\'s threads')
b = s.index('// a group\'s block of job j')
body = s[a:b]
open(sys.argv[3] + '/t4_src.inc', 'w').write(body)
c = open(sys.argv[2]).read()
i = c.index('#define TURBO_CUDA_SIGN_WORDS'); j = c.index('static __device__ __constant__ float turbo_d_c3')
open(sys.argv[3] + '/turbo_consts.inc', 'w').write(c[i:j])
i = c.index('// ---- encode helpers shared'); j = c.index('// ---- end of the encode helpers')
open(sys.argv[3] + '/turbo_helpers.inc', 'w').write(c[i:j])
PY
g++ -O1 -std=c++20 -ffp-contract=off -fopenmp "$here/set_rows_t4_check.cpp" -I"$tmp" -I"$here/../../cpu_ref" \
    -I"$src/ggml/include" -L"$bld/ggml/src" -lggml-base -lpthread -lm -o "$tmp/t4_check" 2>&1 | grep -v "^$" | head -30
"$tmp/t4_check"
rm -rf "$tmp"
