#!/usr/bin/env bash
# helper-22 (run 35): the 64-value types' cache writes through turbo.cu's fused write (key offset, K/V pair, K's RoPE)
# and Q's RoPE in their tensor-core decode. Phases (args): build test bench ppl
#   build: cmake + ninja of .devcarry/h2/tree.tar.gz (the pinned tree, patches 0001-0051) with cuda/*.cu, *.cuh copied
#          over its ggml-cuda and .devcarry/h22/tests/test-backend-ops.cpp (patch 0051 as amended here) over its tests
#   ppl:   SmolLM2-135M (head_dim 64) KLD as run 34; needs .devcarry/h20b (part 1, jargon) in this or an earlier call
#          of the same machine and .devcarry/h20a (part 0)
#   DL=<seconds>: optional work is skipped past it
set -u
R=$(pwd); O=$OUT; W=/tmp/h22; B=$W/build/bin; T0=$(date +%s); DL=${DL:-420}
el() { echo $(( $(date +%s) - T0 )); }
S=$O/summary.txt
log() { echo "[$(el)s] $*" | tee -a $S; }
mkdir -p $W/logs
PH=" $* "
finish() { cp $S $W/logs/summary-$(date +%H%M%S).txt 2>/dev/null; tar czf $O/logs.tgz -C $W logs 2>/dev/null; }
trap finish EXIT
log "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) | $(nproc) cores | $(date -u +%FT%TZ) | phases:$PH"
for p in .devcarry/h20a/smol.p0 .devcarry/h20b/smol.p1 .devcarry/h20b/jargon.txt.gz; do [ -f "$p" ] && cp "$p" $W/; done
if [[ "$PH" == *" build "* ]]; then
  mkdir -p $W/src && tar xzf .devcarry/h2/tree.tar.gz -C $W/src || { log "no tree"; exit 1; }
  cp cuda/*.cu cuda/*.cuh $W/src/tree/ggml/src/ggml-cuda/ && cp .devcarry/h22/tests/test-backend-ops.cpp $W/src/tree/tests/ \
    || { log "no sources"; exit 1; }
  log "sources: $(md5sum cuda/turbo.cu cuda/turbo-64.cu cuda/turbo-common.cuh cuda/fattn-turbo.cu cuda/fattn-turbo-mma.cuh | cut -c1-12 | tr '\n' ' ')"
  cmake -S $W/src/tree -B $W/build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_APP=OFF > $W/logs/cmake.txt 2>&1 || { log "cmake failed"; tail -20 $W/logs/cmake.txt; exit 1; }
  ninja -C $W/build -j$(nproc) test-backend-ops llama-bench llama-perplexity > $W/logs/build.txt 2>&1 \
    || { log "build FAILED"; grep -B2 -A14 "error" $W/logs/build.txt | head -60; exit 1; }
  g++ -O2 -std=c++17 cuda/test-turbo-cuda.cpp -I$W/src/tree/ggml/include -L$B -lggml -lggml-base -lggml-cpu -lggml-cuda \
    -Wl,-rpath,$B -o $B/test-turbo-cuda > $W/logs/ttc-build.txt 2>&1 || log "test-turbo-cuda build failed"
  log "build ok"
fi
tbo() {   # op filter tag
  local op=$1 f=$2 n=$W/logs/tbo-$1-$3.txt
  if [ "$(el)" -gt "$DL" ]; then log "deadline: skip $op $f"; return; fi
  timeout 120 $B/test-backend-ops -b CUDA0 -o $op -p "$f" > $n 2>&1; local rc=$?
  log "test-backend-ops -b CUDA0 -o $op -p '$f': rc=$rc | $(grep -E 'tests passed' $n | tail -1) | FAIL $(grep -c FAIL $n) | not supported $(grep -c 'not supported' $n) | _64: OK $(grep '_64' $n | grep -c OK) FAIL $(grep '_64' $n | grep -c FAIL) | $(grep -o 'turbo: [^(]*' $n | sort -u | tr '\n' ';')"
  grep -E "FAIL" $n | head -8 | cut -c1-260 | tee -a $S
}
if [[ "$PH" == *" test "* ]]; then
  $B/test-turbo-cuda > $W/logs/bitexact.txt 2>&1; log "test-turbo-cuda rc=$? | $(grep -c 'rows identical' $W/logs/bitexact.txt) cases | $(grep 'BITEXACT [PF]' $W/logs/bitexact.txt) | _64 cases: $(grep '_64' $W/logs/bitexact.txt | grep -c 'rows identical')"
  grep -v "rows identical\|BITEXACT [PF]" $W/logs/bitexact.txt | head -6 | tee -a $S
  tbo SET_ROWS '_64' s64; tbo SUB_SET_ROWS '_64' s64; tbo ROPE_FLASH_ATTN '_64' s64; tbo FLASH_ATTN_EXT '_64' s64
  tbo CPY 'type_dst=turbo[234]_64|type_src=turbo[234]_64,type_dst=f32' s64; tbo GET_ROWS '_64' s64
  tbo SET_ROWS 'turbo' all; tbo SUB_SET_ROWS 'turbo' all; tbo ROPE_FLASH_ATTN 'turbo' all
fi
if [[ "$PH" == *" bench "* ]]; then
  M=$W/random-llama1b-q4_0.gguf
  PYTHONPATH=$R/python:$W/src/tree/gguf-py python3 -c "
from turbo_llama.shapes import Shape, write_random_gguf
s = Shape('llama1b', 16, 2048, 32, 8, 64, 8192, 128256, 131072, note='Llama-3.2-1B shape (head_dim 64)')
write_random_gguf(s, '$M')" > $W/logs/gguf.txt 2>&1 || { log "gguf failed"; tail -5 $W/logs/gguf.txt; }
  for round in 1 2; do
    for t in f16 turbo3; do
      if [ "$(el)" -gt "$DL" ]; then log "deadline: skip bench $t"; continue; fi
      $B/llama-bench -m $M -fa 1 -ngl 99 -ctk $t -ctv $t -p 0 -n 64 -d ${DEPTHS:-0,32768} -r ${REPS:-3} -o md > $W/logs/bench-$t-$round.md 2>&1
      log "llama-bench llama1b -fa 1 -ngl 99 -ctk $t -ctv $t -p 0 -n 64 -d ${DEPTHS:-0,32768} -r ${REPS:-3} round $round rc=$?"; grep -E "tg64" $W/logs/bench-$t-$round.md | tee -a $S
      grep -iE "error|fail|abort" $W/logs/bench-$t-$round.md | head -4 | tee -a $S
    done
  done
  # which fusions the decode graph took (each is said once per process)
  $B/llama-bench -m $M -fa 1 -ngl 99 -ctk turbo3 -ctv turbo3 -p 0 -n 4 -d 0 -r 1 -v > $W/logs/bench-v.txt 2>&1
  log "verbose turbo3 bench rc=$? | $(grep -oE 'turbo: [^(]*|64-value blocks \([a-z0-9_]*\)' $W/logs/bench-v.txt | sort -u | tr '\n' ';')"
fi
if [[ "$PH" == *" ppl "* ]]; then
  M=$W/smol.gguf
  [ -f $M ] || { [ -f $W/smol.p0 ] && [ -f $W/smol.p1 ] && cat $W/smol.p0 $W/smol.p1 > $M; }
  [ -f $W/jargon.txt ] || gunzip -c $W/jargon.txt.gz > $W/jargon.txt
  log "smol sha256 $(sha256sum $M | cut -c1-64) | jargon sha256 $(sha256sum $W/jargon.txt | cut -c1-16)"
  G="$B/llama-perplexity -m $M -f $W/jargon.txt -c 2048 --chunks 2 -fa on -ngl 99"
  C="env CUDA_VISIBLE_DEVICES= $B/llama-perplexity -m $M -f $W/jargon.txt -c 2048 --chunks 2 -fa on -ngl 0 -t 16"
  pr() {  # name, then the command line
    local n=$1; shift
    echo "$*" > $W/logs/p-$n.txt; "$@" >> $W/logs/p-$n.txt 2>&1; local rc=$?
    log "$n rc=$rc | $(grep -E 'Final estimate|Mean    KLD|Same top p' $W/logs/p-$n.txt | sed 's/^.*Final/Final/' | tr -s ' ' | tr '\n' ';') | $(grep -oE 'turbo: [^(]*' $W/logs/p-$n.txt | sort -u | tr '\n' ';')"
    echo "    cmd: $*" | sed "s#$W/##g; s#$B/##g" >> $S
  }
  pr c-f32 $C -ctk f32 -ctv f32 --kl-divergence-base $W/c-f32.kld
  pr g-turbo3-vs-cf32 $G -ctk turbo3 -ctv turbo3 --kl-divergence-base $W/c-f32.kld --kl-divergence
  pr g-ub1-turbo3-vs-cf32 $G -ub 1 -ctk turbo3 -ctv turbo3 --kl-divergence-base $W/c-f32.kld --kl-divergence
  pr g-ub1-turbo4-vs-cf32 $G -ub 1 -ctk turbo4 -ctv turbo4 --kl-divergence-base $W/c-f32.kld --kl-divergence
fi
log "done"
