#!/usr/bin/env bash
# turbo-llama: builds and runs combine_bench.cu (the decode split merges alone) on a CUDA GPU.
#   cuda/host-check/combine_bench.sh <prepared llama.cpp tree> [sm arch, default 90]
# The repository's cuda/ sources are copied over the tree's copies first (as ci/gpu-run.sh does).
set -eu
REPO=$(cd "$(dirname "$0")/../.." && pwd)
TREE=$1
ARCH=${2:-90}
# the patch series of the pin: patches/pin.toml's [patches] series = "..." (no pin number in this script)
SERIES=$(sed -n 's/^series *= *"\([^"]*\)".*/\1/p' "$REPO/patches/pin.toml")
[ -n "$SERIES" ] && [ -f "$REPO/patches/$SERIES/overlay" ] || { echo "no patch series in $REPO/patches/pin.toml" >&2; exit 1; }
while read -r s d; do case "$s" in cuda/*) cp "$REPO/$s" "$TREE/$d" ;; esac; done < "$REPO/patches/$SERIES/overlay"
OUTBIN=${TMPDIR:-/tmp}/combine_bench
nvcc -arch=sm_$ARCH -O3 -std=c++17 -I"$TREE/ggml/include" -I"$TREE/ggml/src" -I"$TREE/ggml/src/ggml-cuda" \
    "$REPO/cuda/host-check/combine_bench.cu" -o "$OUTBIN"
"$OUTBIN"
