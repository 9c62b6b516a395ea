#!/usr/bin/env bash
# helper-21, run 33 call 2: measurement build of the D = 64 decode's loop and split count (dev-only env switches
# H21_LOOP / H21_TT_MIN / H21_SPLIT_DIV in .devcarry/h21/cuda's fattn-turbo.cu; not in the product)
# (.devcarry/h21/cuda = the committed cuda/ of run 33 plus variants.diff: the two-tile instances at D = 64 and the switches)
set -u
R=$(pwd); O=$OUT; W=/tmp/h21; B=$W/build/bin; T0=$(date +%s); DL=${DL:-520}; CU=.devcarry/h21/cuda
el() { echo $(( $(date +%s) - T0 )); }
S=$O/summary.txt
log() { echo "[$(el)s] $*" | tee -a $S; }
mkdir -p $W/logs
log "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) | $(date -u +%FT%TZ) | sources $CU"
[ -f $W/tree/CMakeLists.txt ] || tar xzf .devcarry/h2/tree.tar.gz -C $W || { log "no tree"; exit 1; }
cp $CU/*.cu $CU/*.cuh $W/tree/ggml/src/ggml-cuda/ && cp .devcarry/h21/tests/test-backend-ops.cpp $W/tree/tests/
finish() { tar czf $O/logs.tgz -C $W logs 2>/dev/null; }
trap finish EXIT
cmake -S $W/tree -B $W/build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_APP=OFF > $W/logs/cmake.txt 2>&1 || { log "cmake failed"; exit 1; }
ninja -C $W/build -j$(nproc) test-backend-ops llama-bench > $W/logs/build.txt 2>&1 || { log "build FAILED"; grep -B2 -A14 "error" $W/logs/build.txt | head -60; exit 1; }
log "build ok"
M=$W/random-llama1b-q4_0.gguf
PYTHONPATH=$R/python:$W/tree/gguf-py python3 -c "
from turbo_llama.shapes import Shape, write_random_gguf
s = Shape('llama1b', 16, 2048, 32, 8, 64, 8192, 128256, 131072, note='Llama-3.2-1B shape (head_dim 64)')
write_random_gguf(s, '$M')" > $W/logs/gguf.txt 2>&1 || log "gguf failed"
H21_LOOP=1 H21_TT_MIN=0 $B/test-backend-ops -b CUDA0 -o FLASH_ATTN_EXT -p _64 > $W/logs/tbo-tt.txt 2>&1
log "two-tile loop everywhere (H21_LOOP=1 H21_TT_MIN=0): test-backend-ops -b CUDA0 -o FLASH_ATTN_EXT -p _64 rc=$? | $(grep 'tests passed' $W/logs/tbo-tt.txt) | FAIL $(grep -c FAIL $W/logs/tbo-tt.txt)"
grep FAIL $W/logs/tbo-tt.txt | head -5 | cut -c1-250 | tee -a $S
v() {   # name env... -- type
  local name=$1; shift; local t=$1; shift
  [ "$(el)" -gt "$DL" ] && { log "deadline: skip $name"; return; }
  env "$@" $B/llama-bench -m $M -fa 1 -ngl 99 -ctk $t -ctv $t -p 0 -n 64 -d 0,8192,32768 -r 3 -o md > $W/logs/v-$name-$round.md 2>&1
  log "$name ($t $*) round $round: $(grep tg64 $W/logs/v-$name-$round.md | awk -F'|' '{printf "%s = %s; ", $(NF-2), $(NF-1)}')"
}
for round in 1 2; do
  v f16 f16
  v t3 turbo3
  v t3-tt turbo3 H21_LOOP=1 H21_TT_MIN=0
  v t3-div2 turbo3 H21_SPLIT_DIV=2
  v t3-tt-div2 turbo3 H21_LOOP=1 H21_TT_MIN=0 H21_SPLIT_DIV=2
  v t4 turbo4
  v t4-tt turbo4 H21_LOOP=1 H21_TT_MIN=0
  v t2 turbo2
  v t2-tt turbo2 H21_LOOP=1 H21_TT_MIN=0
done
log "done"
