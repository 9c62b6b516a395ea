#!/usr/bin/env bash
# helper-20: (1) validate c940fd6 (cuda/turbo-64.cu on the prefill's cell-0 overlay / contiguous-view helper) on the H200;
# (2) the SmolLM2 GPU/CPU KLD gap of the 64-value types. Phases (args): stash build test ppl
#   stash: call 0 leaves the model's first part (.devcarry/h20a/smol.p0) in /tmp/h20 (64 MiB carry limit per call)
#   build: cmake+ninja of .devcarry/h2/tree.tar.gz (the pinned tree, patches 0001-0051) with .devcarry/h20/cuda
#          (cuda/ of HEAD c940fd6) copied over it; test runs in the background while ppl runs in the foreground
set -u
R=$(pwd); O=$OUT; W=/tmp/h20; B=$W/build/bin; T0=$(date +%s); DL=${DL:-400}; TDL=${TDL:-450}
el() { echo $(( $(date +%s) - T0 )); }
S=$O/summary.txt
log() { echo "[$(el)s] $*" | tee -a $S; }
mkdir -p $W/logs
PH=" $* "
finish() { cp $S $W/logs/summary-$(date +%H%M%S).txt 2>/dev/null; tar czf $O/logs.tgz -C $W logs 2>/dev/null; }
trap finish EXIT
log "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) | $(nproc) cores | $(date -u +%FT%TZ) | phases:$PH"
for p in .devcarry/h20a/smol.p0 .devcarry/h20b/smol.p1 .devcarry/h20b/jargon.txt.gz; do [ -f "$p" ] && cp "$p" $W/; done
if [[ "$PH" == *" stash "* ]]; then log "stashed: $(ls -la $W | grep -c smol) model part(s) in $W"; fi
if [[ "$PH" == *" build "* ]]; then
  mkdir -p $W/src && tar xzf .devcarry/h2/tree.tar.gz -C $W/src || { log "no tree"; exit 1; }
  # the pinned tree with patches 0001-0051 (tree.tar.gz of run 32), cuda/ of HEAD c940fd6 copied over it (as ci/gpu-run.sh)
  while read -r s d; do case "$s" in cuda/*) cp .devcarry/h20/$s $W/src/tree/$d ;; esac; done < patches/b11312/overlay
  log "overlay: $(cd .devcarry/h20 && md5sum cuda/turbo-64.cu cuda/turbo.cuh cuda/fattn-turbo-prefill.cu | cut -c1-12 | tr '\n' ' ')"
  cmake -S $W/src/tree -B $W/build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_APP=OFF > $W/logs/cmake.txt 2>&1 || { log "cmake failed"; tail -20 $W/logs/cmake.txt; exit 1; }
  ninja -C $W/build -j$(nproc) test-backend-ops llama-perplexity > $W/logs/build.txt 2>&1 \
    || { log "build FAILED"; grep -B2 -A14 "error" $W/logs/build.txt | head -60; exit 1; }
  g++ -O2 -std=c++17 .devcarry/h20/cuda/test-turbo-cuda.cpp -I$W/src/tree/ggml/include -L$B -lggml -lggml-base -lggml-cpu -lggml-cuda \
    -Wl,-rpath,$B -o $B/test-turbo-cuda > $W/logs/ttc-build.txt 2>&1 || log "test-turbo-cuda build failed"
  log "build ok"
fi
tbo() {   # op filter tag
  local op=$1 f=$2 n=$W/logs/tbo-$1-$3.txt
  if [ "$(el)" -gt "$TDL" ]; then log "deadline: skip $op $f"; return; fi
  timeout $(( TDL + 30 - $(el) )) $B/test-backend-ops -b CUDA0 -o $op -p "$f" > $n 2>&1; local rc=$?
  log "test-backend-ops -b CUDA0 -o $op -p '$f': rc=$rc | $(grep -E 'tests passed' $n | tail -1) | FAIL $(grep -c FAIL $n) | not supported $(grep -c 'not supported' $n) | _64: OK $(grep '_64' $n | grep -c OK) FAIL $(grep '_64' $n | grep -c FAIL) not-supported $(grep '_64' $n | grep -c 'not supported')"
  grep -E "FAIL" $n | head -8 | cut -c1-260 | tee -a $S
}
runtests() {
  $B/test-turbo-cuda > $W/logs/bitexact.txt 2>&1; log "test-turbo-cuda rc=$? | $(grep -c 'rows identical' $W/logs/bitexact.txt) cases | $(grep 'BITEXACT [PF]' $W/logs/bitexact.txt) | _64 cases: $(grep '_64' $W/logs/bitexact.txt | grep -c 'rows identical')"
  grep -v "rows identical\|BITEXACT [PF]" $W/logs/bitexact.txt | head -6 | tee -a $S
  tbo SET_ROWS '_64' s64; tbo SUB_SET_ROWS '_64' s64; tbo CPY 'type_dst=turbo[234]_64|type_src=turbo[234]_64,type_dst=f32' s64
  tbo GET_ROWS '_64' s64; tbo FLASH_ATTN_EXT '_64' s64
  tbo FLASH_ATTN_EXT 'turbo' all
}
TP=
if [[ "$PH" == *" test "* ]]; then runtests & TP=$!; fi
if [[ "$PH" == *" ppl "* ]]; then
  M=$W/smol.gguf
  [ -f $M ] || { [ -f $W/smol.p0 ] && [ -f $W/smol.p1 ] && cat $W/smol.p0 $W/smol.p1 > $M; }
  [ -f $W/jargon.txt ] || gunzip -c $W/jargon.txt.gz > $W/jargon.txt
  log "smol sha256 $(sha256sum $M | cut -c1-64) | jargon sha256 $(sha256sum $W/jargon.txt | cut -c1-16)"
  G="$B/llama-perplexity -m $M -f $W/jargon.txt -c 2048 --chunks 2 -fa on -ngl 99"
  C="env CUDA_VISIBLE_DEVICES= $B/llama-perplexity -m $M -f $W/jargon.txt -c 2048 --chunks 2 -fa on -ngl 0 -t 16"
  pr() {  # name, then the command line (env prefix allowed)
    local n=$1; shift
    if [ "$(el)" -gt "$DL" ]; then log "deadline: skip $n"; return; fi
    echo "$*" > $W/logs/p-$n.txt; "$@" >> $W/logs/p-$n.txt 2>&1; local rc=$?
    log "$n rc=$rc | $(grep -E 'Final estimate|Mean PPL\(Q\) +:|Mean PPL\(base\) +:|Mean PPL\(Q\)/|Mean    KLD|Same top p' $W/logs/p-$n.txt | sed 's/^.*Final/Final/' | tr -s ' ' | tr '\n' ';')"
    echo "    cmd: $*" | sed "s#$W/##g; s#$B/##g" >> $S
    grep "turbo K:" $W/logs/p-$n.txt | sed 's/^.*turbo K:/    turbo K:/' | head -3 >> $S
  }
  KB="--kl-divergence-base"; KL="--kl-divergence"
  # (1) own f16 bases (as run 32) and the cross-backend KLD of the f16 bases
  pr g-f16 $G $KB $W/g-f16.kld
  pr c-f16 $C $KB $W/c-f16.kld
  pr g-f16-vs-cf16 $G $KB $W/c-f16.kld $KL
  # (2) a common higher-precision reference: the CPU with an f32 cache (tiled f32 attention)
  pr c-f32 $C -ctk f32 -ctv f32 $KB $W/c-f32.kld
  pr c-f16-vs-cf32 $C $KB $W/c-f32.kld $KL
  pr g-f16-vs-cf32 $G $KB $W/c-f32.kld $KL
  for t in turbo4 turbo3; do
    pr g-$t-vs-cf32 $G -ctk $t -ctv $t $KB $W/c-f32.kld $KL
    pr c-$t-vs-cf32 $C -ctk $t -ctv $t $KB $W/c-f32.kld $KL
  done
  # (3) each turbo path against the other backend's f16 base
  for t in turbo4 turbo3; do
    pr g-$t-vs-cf16 $G -ctk $t -ctv $t $KB $W/c-f16.kld $KL
    pr c-$t-vs-gf16 $C -ctk $t -ctv $t $KB $W/g-f16.kld $KL
  done
  # (4) key offsets off on both paths, each against its own base
  for t in turbo4 turbo3; do
    pr g-$t-nooff env TURBO_K_OFFSET=0 $G -ctk $t -ctv $t $KB $W/g-f16.kld $KL
    pr c-$t-nooff env TURBO_K_OFFSET=0 $C -ctk $t -ctv $t $KB $W/c-f16.kld $KL
  done
  # (5) run 32's figures again (each against its own base)
  for t in turbo4 turbo3; do
    pr g-$t $G -ctk $t -ctv $t $KB $W/g-f16.kld $KL
    pr c-$t $C -ctk $t -ctv $t $KB $W/c-f16.kld $KL
  done
  # (6) the decode path on the GPU (-ub 1) and attention without FA, against the f32 reference
  pr g-ub1-f16-vs-cf32 $G -ub 1 $KB $W/c-f32.kld $KL
  pr g-ub1-turbo3-vs-cf32 $G -ub 1 -ctk turbo3 -ctv turbo3 $KB $W/c-f32.kld $KL
  pr g-ub1-turbo4-vs-cf32 $G -ub 1 -ctk turbo4 -ctv turbo4 $KB $W/c-f32.kld $KL
  pr g-f16-nofa-vs-cf32 $G -fa off $KB $W/c-f32.kld $KL
fi
[ -n "$TP" ] && wait $TP
log "done"
