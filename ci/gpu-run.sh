#!/usr/bin/env bash
# turbo-llama: the whole GPU run in one go (H200 via the device tool, or any CUDA machine).
#   ci/gpu-run.sh [build] [test] [bench]      (default: all three; results in $OUT, default /tmp/gpu-out)
# Needs .devcarry/tree.tar.gz: the stripped upstream tree (b11312) with our overlay + patches applied
# (made by ci/make-devcarry.sh from the patched dev tree: git archive minus docs/ models/ media/, unused backends).
# The current cuda/ sources are copied over the tree's copies, so kernel fixes need no new tarball.
# Time guard: the benchmark stops starting new runs after ${TL_DEADLINE:-540} s.
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
WORK=${TL_WORK:-/tmp/tl}; TREE=$WORK/tree; BUILD=$WORK/build; B=$BUILD/bin
DEADLINE=${TL_DEADLINE:-540}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[$(el)s] $*" | tee -a "$OUT/summary.txt"; }
PHASES="${*:-build test bench}"

log "machine: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null) | $(nproc) cores | nvcc $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*') | $(date -u +%FT%TZ)"

if [ ! -d "$TREE" ]; then
    mkdir -p "$WORK" && tar xzf "$REPO/.devcarry/tree.tar.gz" -C "$WORK" || { log "tarball missing"; exit 1; }
fi
while read -r src dst; do
    case "$src" in cuda/*) cp "$REPO/$src" "$TREE/$dst" ;; esac
done < "$REPO/patches/b11312/overlay"

if [[ " $PHASES " == *" build "* ]]; then
    log "configure + build"
    cmake -S "$TREE" -B "$BUILD" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=ON \
        -DLLAMA_BUILD_APP=OFF > "$OUT/build.log" 2>&1 || { log "cmake failed"; tail -30 "$OUT/build.log"; exit 1; }
    ninja -C "$BUILD" -j"$(nproc)" test-backend-ops llama-bench llama-perplexity llama-completion >> "$OUT/build.log" 2>&1 \
        || { log "build failed"; grep -B2 -A12 "error" "$OUT/build.log" | head -80; exit 1; }
    log "build ok"
    g++ -O2 -std=c++17 "$REPO/cuda/test-turbo-cuda.cpp" -I"$TREE/ggml/include" -L"$B" -lggml -lggml-base -lggml-cpu -lggml-cuda \
        -Wl,-rpath,"$B" -o "$B/test-turbo-cuda" >> "$OUT/build.log" 2>&1 || log "test-turbo-cuda build failed"
fi

if [[ " $PHASES " == *" test "* ]]; then
    log "bit-exactness of the CUDA write path"
    "$B/test-turbo-cuda" > "$OUT/bitexact.log" 2>&1; log "test-turbo-cuda rc=$?"
    grep "BITEXACT" "$OUT/bitexact.log" | tee -a "$OUT/summary.txt"
    : > "$OUT/tbo.log"
    # CPY turbo -> f16 is left out: the CPU reference (ggml-cpu dup) aborts on quantized -> f16 (lead's side)
    for spec in "SET_ROWS|turbo" "CPY|type_dst=turbo|type_src=turbo[23],type_dst=f32" "GET_ROWS|turbo" "FLASH_ATTN_EXT|turbo"; do
        op=${spec%%|*}; filt=${spec#*|}
        echo "=== test-backend-ops -b CUDA0 -o $op -p '$filt'" >> "$OUT/tbo.log"
        "$B/test-backend-ops" -b CUDA0 -o $op -p "$filt" > "$WORK/tbo_one.log" 2>&1
        rc=$?; cat "$WORK/tbo_one.log" >> "$OUT/tbo.log"
        log "test-backend-ops -b CUDA0 -o $op -p '$filt': rc=$rc | $(grep -E 'tests passed' "$WORK/tbo_one.log" | tail -1) | FAIL lines: $(grep -c FAIL "$WORK/tbo_one.log")"
    done
    if [ -n "${TL_PERF:-}" ]; then
        "$B/test-backend-ops" perf -b CUDA0 -o SET_ROWS -p "type=(turbo3|turbo2|f16|q8_0)" > "$WORK/perf.log" 2>&1
        grep -E "SET_ROWS" "$WORK/perf.log" | grep -E "GB/s" | tee -a "$OUT/summary.txt" | head -20 > /dev/null
        "$B/test-backend-ops" perf -b CUDA0 -o CPY -p "type_src=f32,type_dst=f32" 2>&1 | grep -E "GB/s" | head -4 >> "$OUT/summary.txt"
    fi
    grep -E "FAIL|not supported" "$OUT/tbo.log" | head -40 >> "$OUT/summary.txt"
fi

if [[ " $PHASES " == *" bench "* ]]; then
    MODEL=$WORK/llama8b-q4_0.gguf
    if [ ! -f "$MODEL" ]; then
        log "writing random-weight Llama-3.1-8B-shaped Q4_0 GGUF (speed only)"
        PYTHONPATH="$TREE/gguf-py" python3 "$REPO/ci/make-random-gguf.py" "$MODEL" llama8b >> "$OUT/bench.log" 2>&1 || log "gguf write failed"
    fi
    "$B/llama-completion" -m "$MODEL" -ctk turbo3 -ctv turbo3 -fa on -ngl 99 -n 16 -p "hello" -no-cnv --no-warmup \
        > "$OUT/completion.log" 2>&1; log "llama-completion -ctk turbo3 -ctv turbo3 -fa on -ngl 99: rc=$? | $(grep -E 'KV buffer|CUDA0 KV' "$OUT/completion.log" | head -2 | tr '\n' ' ')"
    for t in ${TL_TYPES:-turbo3 f16 q8_0 q4_0 turbo2}; do
        if [ "$(el)" -gt "$DEADLINE" ]; then log "deadline: skipping bench $t"; continue; fi
        echo "=== llama-bench -m llama8b-q4_0(random) -fa 1 -ngl 99 -p 512 -n 128 -d ${TL_DEPTHS:-0,8192,32768} -ctk $t -ctv $t -r ${TL_REPS:-2}" >> "$OUT/bench.log"
        "$B/llama-bench" -m "$MODEL" -fa 1 -ngl 99 -p 512 -n 128 -d "${TL_DEPTHS:-0,8192,32768}" -ctk $t -ctv $t -r "${TL_REPS:-2}" -o md >> "$OUT/bench.log" 2>&1
        log "bench $t rc=$?"
    done
    grep -E "^\|" "$OUT/bench.log" | grep -v -- "---" | sort -u >> "$OUT/summary.txt"
fi
log "done"
