#!/usr/bin/env bash
# helper H2 (issue #33): the 64-value turbo types on CUDA. Phases (args): build test bench ppl
set -u
R=$(pwd); O=$OUT; W=/tmp/h2; B=$W/build/bin; T0=$(date +%s); DL=${DL:-560}
el() { echo $(( $(date +%s) - T0 )); }
S=$O/summary.txt
log() { echo "[$(el)s] $*" | tee -a $S; }
mkdir -p $W/logs
PH=" $* "
log "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) | $(nproc) cores | $(date -u +%FT%TZ) | phases:$PH"
for p in .devcarry/h2/smol.p0 .devcarry/h2b/smol.p1; do [ -f "$p" ] && cp "$p" $W/; done
cp .devcarry/h2/jargon.txt $W/ 2>/dev/null
if [ ! -f $W/tree/CMakeLists.txt ]; then tar xzf .devcarry/h2/tree.tar.gz -C $W || { log "no tree"; exit 1; }; fi
for u in .devcarry/h2/upd.tar.gz .devcarry/h2b/upd.tar.gz; do [ -f $u ] && tar xzf $u -C $W/tree && log "applied $u"; done
finish() { tar czf $O/logs.tgz -C $W logs 2>/dev/null; }
trap finish EXIT
if [[ "$PH" == *" build "* ]]; then
  if [ ! -f $W/build/build.ninja ]; then
    cmake -S $W/tree -B $W/build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
      -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_APP=OFF > $W/logs/cmake.txt 2>&1 || { log "cmake failed"; tail -30 $W/logs/cmake.txt; exit 1; }
  fi
  ninja -C $W/build -j$(nproc) ${TARGETS:-test-backend-ops llama-bench llama-perplexity} > $W/logs/build.txt 2>&1 \
    || { log "build FAILED"; grep -B2 -A14 "error" $W/logs/build.txt | head -80; exit 1; }
  log "build ok"
  g++ -O2 -std=c++17 .devcarry/h2/test-turbo-cuda.cpp -I$W/tree/ggml/include -L$B -lggml -lggml-base -lggml-cpu -lggml-cuda \
    -Wl,-rpath,$B -o $B/test-turbo-cuda > $W/logs/ttc-build.txt 2>&1 || log "test-turbo-cuda build failed"
fi
tbo() {   # op filter
  local op=$1 f=$2 n=$W/logs/tbo-$1-$3.txt
  if [ "$(el)" -gt "$DL" ]; then log "deadline: skip $op $f"; return; fi
  timeout $(( DL + 30 - $(el) )) $B/test-backend-ops -b CUDA0 -o $op -p "$f" > $n 2>&1; local rc=$?
  log "test-backend-ops -b CUDA0 -o $op -p '$f': rc=$rc | $(grep -E 'tests passed' $n | tail -1) | FAIL $(grep -c FAIL $n) | not supported $(grep -c 'not supported' $n) | _64: OK $(grep '_64' $n | grep -c OK) FAIL $(grep '_64' $n | grep -c FAIL) not-supported $(grep '_64' $n | grep -c 'not supported')"
  grep -E "FAIL" $n | head -8 | cut -c1-260 | tee -a $S
}
if [[ "$PH" == *" test "* ]]; then
  $B/test-turbo-cuda > $W/logs/bitexact.txt 2>&1; log "test-turbo-cuda rc=$? | $(grep -c 'rows identical' $W/logs/bitexact.txt) cases | $(grep 'BITEXACT [PF]' $W/logs/bitexact.txt)"
  grep "_64" $W/logs/bitexact.txt | cut -c1-200 | tee -a $S
  grep -v "rows identical\|BITEXACT [PF]" $W/logs/bitexact.txt | head -10 | tee -a $S
  # the _64 cases first (the new code), then every turbo case (the 128-value paths must not have moved)
  tbo SET_ROWS '_64' s64; tbo SUB_SET_ROWS '_64' s64; tbo CPY 'type_dst=turbo[234]_64|type_src=turbo[234]_64,type_dst=f32' s64
  tbo GET_ROWS '_64' s64; tbo FLASH_ATTN_EXT '_64' s64
  tbo SET_ROWS 'turbo' all; tbo SUB_SET_ROWS 'turbo' all; tbo CPY 'type_dst=turbo|type_src=turbo[234](_64)?,type_dst=f32' all
  tbo GET_ROWS 'turbo' all; tbo FLASH_ATTN_EXT 'turbo' all; tbo ROPE_FLASH_ATTN 'turbo' all
fi
if [[ "$PH" == *" bench "* ]]; then
  M=$W/random-llama1b-q4_0.gguf
  if [ ! -f $M ]; then
    PYTHONPATH=$R/python:$W/tree/gguf-py python3 -c "
from turbo_llama.shapes import Shape, write_random_gguf
s = Shape('llama1b', 16, 2048, 32, 8, 64, 8192, 128256, 131072, note='Llama-3.2-1B shape (head_dim 64)')
write_random_gguf(s, '$M')" > $W/logs/gguf.txt 2>&1 || { log "gguf failed"; tail -5 $W/logs/gguf.txt; }
  fi
  for round in 1 2; do
    for t in f16 turbo3; do
      if [ "$(el)" -gt "$DL" ]; then log "deadline: skip bench $t"; continue; fi
      $B/llama-bench -m $M -fa 1 -ngl 99 -ctk $t -ctv $t -p 0 -n 64 -d ${DEPTHS:-0,8192,32768} -r 2 -o md > $W/logs/bench-$t-$round.md 2>&1
      log "llama-bench llama1b -ctk $t -ctv $t round $round rc=$?"; grep -E "tg64" $W/logs/bench-$t-$round.md | tee -a $S
      grep -iE "turbo|error|fail" $W/logs/bench-$t-$round.md | grep -v "tg64" | head -4 | tee -a $S
    done
  done
fi
if [[ "$PH" == *" ppl "* ]]; then
  M=$W/smol.gguf
  [ -f $M ] || { [ -f $W/smol.p0 ] && [ -f $W/smol.p1 ] && cat $W/smol.p0 $W/smol.p1 > $M; }
  log "smol sha256 $(sha256sum $M | cut -c1-16)"
  P="$B/llama-perplexity -m $M -f $W/jargon.txt -c 2048 --chunks 2 -fa on -ngl 99"
  $P --kl-divergence-base $W/f16.kld > $W/logs/ppl-f16.txt 2>&1; log "f16 base rc=$? $(grep -E 'Final estimate' $W/logs/ppl-f16.txt)"
  for t in turbo3 turbo4 turbo2; do
    if [ "$(el)" -gt "$DL" ]; then log "deadline: skip ppl $t"; continue; fi
    $P -ctk $t -ctv $t --kl-divergence-base $W/f16.kld --kl-divergence > $W/logs/ppl-$t.txt 2>&1
    log "ppl $t rc=$? | $(grep -E 'Mean PPL\(Q\)|Mean ln|Mean    KLD|Mean KLD|Same top' $W/logs/ppl-$t.txt | tr -s ' ' | tr '\n' ';')"
    grep -iE "turbo.*64|runs on the CPU|no CUDA|host memory" $W/logs/ppl-$t.txt | head -4 | tee -a $S
  done
fi
if [[ "$PH" == *" ppl2 "* ]]; then
  # the same machine, GPU (-ngl 99) against CPU (no CUDA device visible): each against its own f16 base
  M=$W/smol.gguf
  [ -f $M ] || { [ -f $W/smol.p0 ] && [ -f $W/smol.p1 ] && cat $W/smol.p0 $W/smol.p1 > $M; }
  log "smol sha256 $(sha256sum $M | cut -c1-16)"
  for dev in gpu cpu; do
    if [ $dev = gpu ]; then P="$B/llama-perplexity -m $M -f $W/jargon.txt -c 2048 --chunks 2 -fa on -ngl 99"; E="";
    else P="$B/llama-perplexity -m $M -f $W/jargon.txt -c 2048 --chunks 2 -fa on -ngl 0 -t 16"; E="env CUDA_VISIBLE_DEVICES="; fi
    $E $P --kl-divergence-base $W/$dev-f16.kld > $W/logs/p2-$dev-f16.txt 2>&1; log "$dev f16 base rc=$? $(grep -E 'Final estimate' $W/logs/p2-$dev-f16.txt)"
    for t in turbo3 turbo4; do
      if [ "$(el)" -gt "$DL" ]; then log "deadline: skip $dev $t"; continue; fi
      $E $P -ctk $t -ctv $t --kl-divergence-base $W/$dev-f16.kld --kl-divergence > $W/logs/p2-$dev-$t.txt 2>&1
      log "$dev $t rc=$? | $(grep -E 'Mean PPL\(Q\)/|Mean    KLD|Same top p' $W/logs/p2-$dev-$t.txt | tr -s ' ' | tr '\n' ';')"
    done
  done
fi
log "done"
