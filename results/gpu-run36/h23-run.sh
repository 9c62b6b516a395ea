#!/usr/bin/env bash
# helper-23 (issue #29): turbo K with q8_0 / f16 V on the tensor-core decode (branch h23). One call:
# build (tree.tar.gz + main's cuda/ + .devcarry/h23's files), the new pairs' tests, llama8b tg128 @32K, all turbo tests
set -u
R=$(pwd); W=/tmp/h23w; B=$W/build/bin; S=$OUT/summary.txt; T0=$(date +%s); DL=${DL:-400}
el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[$(el)s] $*" | tee -a $S; }
mkdir -p $W/logs
finish() { tar czf $OUT/logs.tgz -C $W logs 2>/dev/null; }
trap finish EXIT
log "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) | $(nproc) cores | $(date -u +%FT%TZ)"
mkdir -p $W/src && tar xzf .devcarry/tree.tar.gz -C $W/src || { log "no tree"; exit 1; }
T=$W/src/tree
# the llama8b random GGUF while the build runs
( PYTHONPATH=$R/python:$T/gguf-py python3 -c "from pathlib import Path; from turbo_llama.shapes import shape_gguf; print(shape_gguf('llama8b', Path('$W/shapes')))" > $W/logs/gguf.txt 2>&1 ) &
GG=$!
cp cuda/*.cu cuda/*.cuh $T/ggml/src/ggml-cuda/ && cp .devcarry/h23/*.cu .devcarry/h23/*.cuh $T/ggml/src/ggml-cuda/ || { log "no sources"; exit 1; }
python3 .devcarry/h23/addtests.py $T/tests/test-backend-ops.cpp >> $S 2>&1
log "sources: $(md5sum $T/ggml/src/ggml-cuda/fattn-turbo-mma.cuh $T/ggml/src/ggml-cuda/fattn-turbo.cu | cut -c1-12 | tr '\n' ' ')"
cmake -S $T -B $W/build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_APP=OFF > $W/logs/cmake.txt 2>&1 || { log "cmake failed"; tail -20 $W/logs/cmake.txt | tee -a $S; exit 1; }
ninja -C $W/build -j$(nproc) test-backend-ops llama-bench > $W/logs/build.txt 2>&1 \
  || { log "build FAILED"; grep -B2 -A14 "error" $W/logs/build.txt | head -60 | tee -a $S; exit 1; }
log "build ok"
tbo() {   # op filter tag
  local op=$1 f=$2 n=$W/logs/tbo-$3.txt
  if [ "$(el)" -gt "$DL" ]; then log "deadline: skip $op $f"; return; fi
  timeout 150 $B/test-backend-ops -b CUDA0 -o $op -p "$f" > $n 2>&1; local rc=$?
  log "test-backend-ops -b CUDA0 -o $op -p '$f': rc=$rc | $(grep -E 'tests passed' $n | tail -1) | OK $(grep -c 'OK$' $n) | FAIL $(grep -c FAIL $n) | not supported $(grep -c 'not supported' $n)"
  grep -E "FAIL" $n | head -10 | cut -c1-300 | tee -a $S
}
tbo FLASH_ATTN_EXT 'type_K=turbo[234],type_V=(q8_0|f16)' new
wait $GG; M=$(tail -1 $W/logs/gguf.txt); log "gguf: $M ($(du -h $M 2>/dev/null | cut -f1))"
$B/llama-bench -m $M -fa 1 -ngl 99 -p 0 -n 128 -d 32768 -r 2 -ctk f16,turbo3 -ctv f16,q8_0 -o md > $W/logs/bench.md 2> $W/logs/bench.err
log "llama-bench -m llama8b -fa 1 -ngl 99 -p 0 -n 128 -d 32768 -r 2 -ctk f16,turbo3 -ctv f16,q8_0: rc=$?"
grep -E "tg128|type_k|---" $W/logs/bench.md | tee -a $S
grep -iE "error|abort|fail" $W/logs/bench.err | head -5 | tee -a $S
tbo FLASH_ATTN_EXT 'turbo' all
tbo ROPE_FLASH_ATTN 'turbo' rope
if [ "$(el)" -lt 380 ]; then
  $B/llama-bench -m $M -fa 1 -ngl 99 -p 0 -n 128 -d 32768 -r 2 -ctk f16,turbo2 -ctv f16,q8_0 -o md > $W/logs/bench2.md 2>&1
  log "llama-bench ... -d 32768 -r 2 -ctk f16,turbo2 -ctv f16,q8_0: rc=$?"; grep -E "tg128" $W/logs/bench2.md | tee -a $S
fi
log "done"
