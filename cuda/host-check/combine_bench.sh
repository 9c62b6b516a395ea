#!/usr/bin/env bash
# turbo-llama: builds and runs combine_bench.cu (the decode split merges alone) on a CUDA GPU.
#   cuda/host-check/combine_bench.sh <prepared llama.cpp tree> [sm arch, default 90]
# The repository's cuda/ sources are copied over the tree's copies first (as ci/gpu-run.sh does).
set -eu
REPO=$(cd "$(dirname "$0")/../.." && pwd)
TREE=$1
ARCH=${2:-90}
while read -r s d; do case "$s" in cuda/*) cp "$REPO/$s" "$TREE/$d" ;; esac; done < "$REPO/patches/b11312/overlay"
OUTBIN=${TMPDIR:-/tmp}/combine_bench
nvcc -arch=sm_$ARCH -O3 -std=c++17 -I"$TREE/ggml/include" -I"$TREE/ggml/src" -I"$TREE/ggml/src/ggml-cuda" \
    "$REPO/cuda/host-check/combine_bench.cu" -o "$OUTBIN"
"$OUTBIN"
