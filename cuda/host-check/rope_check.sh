#!/usr/bin/env bash
# The fused-RoPE math of cuda/turbo-common.cuh (turbo_rope_preload, turbo_rope_cs, turbo_rope_block and its two parts),
# compiled as host code with a warp emulated lane by lane, against ggml's CPU ROPE (normal, neox, with and without YaRN,
# with and without frequency factors).
# Needs the CPU build of turbo-llama (`turbo-llama build`); prints max |diff| per case (float angles: it grows with position).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=${TURBO_LLAMA_SRC:-$HOME/.cache/turbo-llama/src/llama.cpp}
bld=${TURBO_LLAMA_BUILD:-$HOME/.cache/turbo-llama/build/cpu}
tmp=$(mktemp -d)
python3 - "$here/../turbo-common.cuh" "$tmp/rope_src.inc" <<'PY'
import sys
s = open(sys.argv[1]).read()
fns = []
for st in ('struct turbo_rope {', 'template <int NV = 4>\nstruct turbo_rope_pre {'):
    a = s.index(st)
    fns.append(s[a:s.index('};', a) + 2])
for name in ('int turbo_rope_pair', 'bool turbo_rope_rotated', 'void turbo_rope_preload', 'void turbo_rope_cs',
             'void turbo_rope_block_cs', 'void turbo_rope_apply', 'void turbo_rope_block'):
    c = s.index(f'static __device__ __forceinline__ {name}(')
    t = s.rfind('\n', 0, c - 1) + 1   # its template line, when it has one
    fns.append(s[t if s.startswith('template', t) else c:s.index('\n}\n', c) + 3])
open(sys.argv[2], 'w').write('\n'.join(fns))
PY
g++ -O1 -std=c++17 "$here/rope_check.cpp" -I"$tmp" -I"$src/ggml/include" -L"$bld/ggml/src" -lggml -lggml-cpu -lggml-base \
    -fopenmp -lpthread -lm -o "$tmp/rope_check"
"$tmp/rope_check" || true
rm -rf "$tmp"
