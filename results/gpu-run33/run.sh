#!/usr/bin/env bash
# helper-21 (run 33): the 64-value types' decode on the tensor-core kernel at D = 64. One call: build, tests, bench.
#   DL=<seconds> CU=<dir with the cuda/ sources, default cuda> BENCH_MORE="turbo4 turbo2" bash results/gpu-run33/run.sh build test bench
# The tree: .devcarry/h2/tree.tar.gz (patches 0001-0051 applied, prepared), CU's *.cu / *.cuh over its ggml-cuda.
set -u
R=$(pwd); O=$OUT; W=/tmp/h21; B=$W/build/bin; T0=$(date +%s); DL=${DL:-560}; CU=${CU:-cuda}
el() { echo $(( $(date +%s) - T0 )); }
S=$O/summary.txt
log() { echo "[$(el)s] $*" | tee -a $S; }
mkdir -p $W/logs
PH=" $* "
log "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) | $(nproc) cores | $(date -u +%FT%TZ) | phases:$PH | sources $CU"
if [ ! -f $W/tree/CMakeLists.txt ]; then tar xzf .devcarry/h2/tree.tar.gz -C $W || { log "no tree"; exit 1; }; fi
cp $CU/*.cu $CU/*.cuh $W/tree/ggml/src/ggml-cuda/ || { log "no sources in $CU"; exit 1; }
# patch 0051's test-backend-ops with the decode shapes of the D = 64 tensor-core kernel (when carried)
[ -f .devcarry/h21/tests/test-backend-ops.cpp ] && cp .devcarry/h21/tests/test-backend-ops.cpp $W/tree/tests/ && log "test-backend-ops.cpp from .devcarry/h21"
finish() { tar czf $O/logs.tgz -C $W logs 2>/dev/null; }
trap finish EXIT
if [[ "$PH" == *" build "* ]]; then
  if [ ! -f $W/build/build.ninja ]; then
    cmake -S $W/tree -B $W/build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
      -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_APP=OFF > $W/logs/cmake.txt 2>&1 || { log "cmake failed"; tail -30 $W/logs/cmake.txt; exit 1; }
  fi
  ninja -C $W/build -j$(nproc) ${TARGETS:-test-backend-ops llama-bench} > $W/logs/build.txt 2>&1 \
    || { log "build FAILED"; grep -B2 -A14 "error" $W/logs/build.txt | head -80; exit 1; }
  log "build ok"
  g++ -O2 -std=c++17 $CU/test-turbo-cuda.cpp -I$W/tree/ggml/include -L$B -lggml -lggml-base -lggml-cpu -lggml-cuda \
    -Wl,-rpath,$B -o $B/test-turbo-cuda > $W/logs/ttc-build.txt 2>&1 || log "test-turbo-cuda build failed"
fi
tbo() {   # op filter tag
  local op=$1 f=$2 n=$W/logs/tbo-$1-$3.txt
  if [ "$(el)" -gt "$DL" ]; then log "deadline: skip $op $f"; return; fi
  timeout $(( DL + 30 - $(el) )) $B/test-backend-ops -b CUDA0 -o $op -p "$f" > $n 2>&1; local rc=$?
  log "test-backend-ops -b CUDA0 -o $op -p '$f': rc=$rc | $(grep -E 'tests passed' $n | tail -1) | FAIL $(grep -c FAIL $n) | not supported $(grep -c 'not supported' $n)"
  grep -E "FAIL" $n | head -8 | cut -c1-300 | tee -a $S
}
bench() {   # types...
  M=$W/random-llama1b-q4_0.gguf
  if [ ! -f $M ]; then
    PYTHONPATH=$R/python:$W/tree/gguf-py python3 -c "
from turbo_llama.shapes import Shape, write_random_gguf
s = Shape('llama1b', 16, 2048, 32, 8, 64, 8192, 128256, 131072, note='Llama-3.2-1B shape (head_dim 64)')
write_random_gguf(s, '$M')" > $W/logs/gguf.txt 2>&1 || { log "gguf failed"; tail -5 $W/logs/gguf.txt; }
  fi
  for round in 1 2; do
    for t in "$@"; do
      if [ "$(el)" -gt "$DL" ]; then log "deadline: skip bench $t"; continue; fi
      $B/llama-bench -m $M -fa 1 -ngl 99 -ctk $t -ctv $t -p 0 -n 64 -d ${DEPTHS:-0,8192,32768} -r 2 -o md > $W/logs/bench-$t-$round.md 2>&1
      log "llama-bench llama1b -fa 1 -ngl 99 -ctk $t -ctv $t -p 0 -n 64 -d ${DEPTHS:-0,8192,32768} -r 2 round $round rc=$?"; grep -E "tg64" $W/logs/bench-$t-$round.md | tee -a $S
      grep -iE "error|fail|abort" $W/logs/bench-$t-$round.md | head -4 | tee -a $S
    done
  done
}
if [[ "$PH" == *" test "* ]]; then
  tbo FLASH_ATTN_EXT '_64' s64
fi
if [[ "$PH" == *" bench "* ]]; then
  bench f16 turbo3 ${BENCH_MORE:-}
fi
if [[ "$PH" == *" test "* ]]; then
  $B/test-turbo-cuda > $W/logs/bitexact.txt 2>&1; log "test-turbo-cuda rc=$? | $(grep -c 'rows identical' $W/logs/bitexact.txt) cases | $(grep 'BITEXACT [PF]' $W/logs/bitexact.txt)"
  tbo FLASH_ATTN_EXT 'turbo' all; tbo ROPE_FLASH_ATTN 'turbo' all
fi
log "done"
