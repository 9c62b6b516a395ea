#!/usr/bin/env bash
# turbo-llama: builds .devcarry/prebuilt.tar.gz (CUDA sm_90 llama-bench + llama-perplexity and their shared
# libraries) on a machine without a GPU or cuBLAS, for `TL_BUILD=prebuilt ci/gpu-run.sh build` on the H200 when the device time
# left is less than a CUDA build there.
#   ci/make-prebuilt.sh <prepared tree dir> [build dir, default /tmp/cbuild]
#   TL_PREBUILT_TARGETS: the programs (default: llama-bench llama-perplexity; with test-backend-ops the tests are
#   configured too)
# Needs nvcc (13.x), cmake, ninja and pip access to PyPI: cuBLAS comes from the `nvidia-cublas` wheel (headers and
# libraries to compile and link against); libcuda is a stub with the driver symbols ggml-cuda uses, for the link
# only. On the H200 the binaries load that machine's own libcudart, libcublas and libcuda (LD_LIBRARY_PATH, set by
# gpu-run.sh). ~25 minutes on 2 cores from scratch; the build dir is reused.
set -eu
TARGETS=${TL_PREBUILT_TARGETS:-llama-bench llama-perplexity}
TESTS=OFF; case " $TARGETS " in *" test-backend-ops "*) TESTS=ON ;; esac
SRC=$1
BLD=${2:-/tmp/cbuild}
REPO=$(cd "$(dirname "$0")/.." && pwd)
# the patch series of the pin: patches/pin.toml's [patches] series = "..." (no pin number in this script)
SERIES=$(sed -n 's/^series *= *"\([^"]*\)".*/\1/p' "$REPO/patches/pin.toml")
[ -n "$SERIES" ] && [ -f "$REPO/patches/$SERIES/overlay" ] || { echo "no patch series in $REPO/patches/pin.toml" >&2; exit 1; }
DEPS=${TL_PREBUILT_DEPS:-/tmp/tl-prebuilt-deps}
PY=${PYTHON:-python3}
[ -x "$REPO/.venv/bin/python" ] && PY=$REPO/.venv/bin/python

CUBLAS=$DEPS/cublas/nvidia/cu13
if [ ! -f "$CUBLAS/lib/libcublas.so.13" ]; then
    mkdir -p "$DEPS/whl" "$DEPS/cublas"
    "$PY" -m pip download -q --no-deps --only-binary :all: "nvidia-cublas>=13,<14" -d "$DEPS/whl"
    (cd "$DEPS/cublas" && unzip -q -o "$DEPS"/whl/nvidia_cublas-*.whl)
fi
ln -sf libcublas.so.13 "$CUBLAS/lib/libcublas.so"
ln -sf libcublasLt.so.13 "$CUBLAS/lib/libcublasLt.so"

# the driver API functions ggml-cuda calls (its VMM pool, device attributes, error strings): a link-time stub
STUB=$DEPS/cudastub
mkdir -p "$STUB"
for f in cuDeviceGet cuDeviceGetAttribute cuGetErrorString cuMemAddressFree cuMemAddressReserve cuMemCreate \
         cuMemGetAllocationGranularity cuMemMap cuMemRelease cuMemSetAccess cuMemUnmap; do
    echo "void $f(void) {}"
done > "$STUB/stub.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$STUB/libcuda.so" "$STUB/stub.c"
ln -sf libcuda.so "$STUB/libcuda.so.1"

# the current cuda/ sources over the tree's copies, as gpu-run.sh does
while read -r s d; do case "$s" in cuda/*) cp "$REPO/$s" "$SRC/$d" ;; esac; done < "$REPO/patches/$SERIES/overlay"

cmake -S "$SRC" -B "$BLD" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=$TESTS \
    -DLLAMA_BUILD_APP=OFF -DGGML_NATIVE=OFF \
    -DCUDA_cublas_LIBRARY="$CUBLAS/lib/libcublas.so" -DCUDA_cublasLt_LIBRARY="$CUBLAS/lib/libcublasLt.so" \
    -DCUDA_cuda_driver_LIBRARY="$STUB/libcuda.so" \
    -DCMAKE_CUDA_FLAGS="-I$CUBLAS/include" -DCMAKE_CXX_FLAGS="-I$CUBLAS/include" > "$BLD.configure.log"
# the executables' link resolves libggml-cuda's libcuda.so.1 and libcublas.so.13 through LD_LIBRARY_PATH
LD_LIBRARY_PATH="$STUB:$CUBLAS/lib" ninja -C "$BLD" -j"$(nproc)" $TARGETS

# with the tests: our bit-exactness test of the CUDA write path too (gpu-run.sh's test phase runs $B/test-turbo-cuda)
EXTRA=""
if [ "$TESTS" = ON ]; then
    LD_LIBRARY_PATH="$STUB:$CUBLAS/lib" g++ -O2 -std=c++17 "$REPO/cuda/test-turbo-cuda.cpp" -I"$SRC/ggml/include" -L"$BLD/bin" \
        -lggml -lggml-base -lggml-cpu -lggml-cuda -Wl,-rpath,'$ORIGIN' -Wl,--allow-shlib-undefined -o "$BLD/bin/test-turbo-cuda"
    EXTRA=test-turbo-cuda
fi
PKG=$(mktemp -d)
mkdir -p "$PKG/bin"
(cd "$BLD/bin" && cp -a $TARGETS $EXTRA lib*.so* "$PKG/bin/")
(cd "$PKG/bin" && strip --strip-unneeded $TARGETS $EXTRA lib*.so.*.* lib*-impl.so)
tar czf "$REPO/.devcarry/prebuilt.tar.gz" -C "$PKG" bin
rm -rf "$PKG"
ls -la "$REPO/.devcarry/prebuilt.tar.gz"
