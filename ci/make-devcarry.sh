#!/usr/bin/env bash
# turbo-llama: builds .devcarry/tree.tar.gz for ci/gpu-run.sh from a prepared (overlaid + patched) llama.cpp tree.
#   ci/make-devcarry.sh <prepared tree dir or git repo> [--pristine]
# --pristine also writes .devcarry/pristine.tar.gz: the untouched pinned tree (`git archive pristine` of a
# prepared tree, ~38 MB), for `turbo-llama build --cuda --llama-src` on the GPU machine (`TL_BUILD=turbo-llama ci/gpu-run.sh build`).
# Strips what a CUDA build does not need (docs, models, media, other backends, the web UI sources (its CMake
# stays: the server build asks for it), benches) to stay far
# below the device tool's 64 MiB per call (about 7 MB compressed).
set -eu
SRC=$1
PRISTINE=${2:-}
REPO=$(cd "$(dirname "$0")/.." && pwd)
# the patch series of the pin: patches/pin.toml's [patches] series = "..." (no pin number in this script)
SERIES=$(sed -n 's/^series *= *"\([^"]*\)".*/\1/p' "$REPO/patches/pin.toml")
[ -n "$SERIES" ] && [ -f "$REPO/patches/$SERIES/overlay" ] || { echo "no patch series in $REPO/patches/pin.toml" >&2; exit 1; }
TMP=$(mktemp -d)
mkdir -p "$TMP/tree"
if [ -d "$SRC/.git" ]; then git -C "$SRC" archive HEAD | tar -x -C "$TMP/tree"; else cp -a "$SRC/." "$TMP/tree/"; rm -rf "$TMP/tree/.git"; fi
# the tree's CUDA dir gets the current cuda/ sources at run time (gpu-run.sh), but keep them in sync here too
while read -r s d; do case "$s" in cuda/*) cp "$REPO/$s" "$TMP/tree/$d" ;; esac; done < "$REPO/patches/$SERIES/overlay"
cd "$TMP/tree"
rm -rf docs models media benches tools/ui/src tools/ui/tests tools/ui/static ggml/src/ggml-{hexagon,sycl,vulkan,opencl,cann,metal,musa,openvino,webgpu,zdnn,zendnn,virtgpu,et}
mkdir -p "$REPO/.devcarry"
tar czf "$REPO/.devcarry/tree.tar.gz" -C "$TMP" tree
# mini.tar.gz: gguf-py alone (~140 KB), for calls that carry prebuilt binaries (`TL_BUILD=prebuilt ci/gpu-run.sh build bench`)
tar czf "$REPO/.devcarry/mini.tar.gz" -C "$TMP" tree/gguf-py
rm -rf "$TMP"
ls -la "$REPO/.devcarry/tree.tar.gz"
if [ "$PRISTINE" = --pristine ]; then
    git -C "$SRC" archive pristine | gzip -6 > "$REPO/.devcarry/pristine.tar.gz"
    ls -la "$REPO/.devcarry/pristine.tar.gz"
fi
