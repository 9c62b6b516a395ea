#!/usr/bin/env bash
# run 36 (lead, 2026-12-03), two calls on fresh machines:
#   A  main 4275c5b (patches 0001-0052): cmake build on the H200 + ci/gpu-run.sh's tests + Q's RoPE fusion (67b42c9)
#   P  main with turbo K / plain V on the tensor cores and patch 0053: binaries built on the CPU machine
#      (ci/make-prebuilt.sh, carried as .devcarry/prebuilt.tar.gz), then ci/gpu-run.sh's tests, issue #29's table
#      (turbo-llama bench --shape llama8b), 128K, four slots (llama-batched-bench), ncu of the decode op and the KV write.
#      Its first call (P1/) returned the slots and ncu files only (8 files at most come back; the bench needed a
#      llama-perplexity in the prebuilt to list the cache types); the second (P2, llama-perplexity added) ran the tests
#      and the benches again, everything in summary.txt and logs.tgz
# DL: no new step after this many seconds
set -u
R=$(pwd); S=$OUT/summary.txt; T0=$(date +%s); DL=${DL:-540}
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $S; }
late() { [ $(( $(date +%s) - T0 )) -gt $DL ] && { log "deadline: skip $*"; return 0; }; return 1; }
B=/tmp/tl/build/bin; GG=/tmp/tl/tree/gguf-py; SH=/tmp/tlcache/shapes
M8() { PYTHONPATH=$R/python:$GG python3 -c "from pathlib import Path; from turbo_llama.shapes import shape_gguf; print(shape_gguf('llama8b', Path('$SH')))"; }
bench() { # turbo-llama bench through the product's command with this machine's binaries; $1: a label
  local lab=$1; shift; late "bench $lab" && return
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .devcarry/whl/*.whl > /dev/null 2>&1
  PYTHONPATH=/tmp/site:$R/python:$GG TURBO_LLAMA_BIN_DIR=$B TURBO_LLAMA_CACHE=/tmp/tlcache TURBO_LLAMA_DATA=$R \
    PYTHONUNBUFFERED=1 python3 -m turbo_llama bench --shape llama8b --backend cuda "$@" > $OUT/bench-$lab.txt 2>&1
  log "turbo-llama bench --shape llama8b --backend cuda $*: rc=$?"; grep -E "^\|" $OUT/bench-$lab.txt | tee -a $S
}
ncu1() { # label, kernel regex, program and arguments: one launch, full set with stall reasons
  local lab=$1 k=$2; shift 2; late "ncu $lab" && return
  timeout 120 ncu --clock-control none --set full -k "regex:$k" -c 1 --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__(inst_executed_pipe|pipe)_.*\.avg\.pct_of_peak_sustained_active,smsp__inst_executed.sum" "$@" > $OUT/ncu-$lab.txt 2>&1
  log "ncu $lab: rc=$? | $(grep -E '^ +(Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per Thread|Issue Slots Busy|Executed Ipc Active|No Eligible) ' $OUT/ncu-$lab.txt | tr -s ' ' | tr '\n' ';' | head -c 600)"
}
for ph in "$@"; do case $ph in
A) TL_TARGETS="test-backend-ops llama-bench llama-batched-bench" OUT=$OUT/a bash ci/gpu-run.sh build test > $OUT/a.txt 2>&1
   cat $OUT/a/summary.txt >> $S
   m=$(M8); for t in turbo3 turbo4 f16/turbo3; do k=${t%/*}; v=${t#*/}
     $B/llama-bench -m $m -fa 1 -ngl 99 -p 0 -n 8 -r 1 -ctk $k -ctv $v -v > $OUT/rope-$k-$v.txt 2>&1
     log "rope check $t: rc=$? | $(grep -c "Q's RoPE done by the decode attention kernel" $OUT/rope-$k-$v.txt) Q-RoPE lines, $(grep -c "K's RoPE done by the turbo K write" $OUT/rope-$k-$v.txt) K-RoPE lines"; done ;;
P|P2) mkdir -p /tmp/tl && tar xzf .devcarry/mini.tar.gz -C /tmp/tl
   if [ $ph = P2 ]; then REAL=$OUT; OUT=/tmp/p2out; mkdir -p $OUT; S=$OUT/summary.txt; trap 'cp $S $REAL/; tar czf $REAL/logs.tgz -C $OUT .' EXIT; fi
   ( M8 > /tmp/m8.txt 2>&1 ) &   # the 4.3 GB random GGUF while the tests run
   TL_PERF= TL_BUILD=prebuilt OUT=$OUT/p bash ci/gpu-run.sh build test > $OUT/p.txt 2>&1; cat $OUT/p/summary.txt >> $S
   export LD_LIBRARY_PATH="$B:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
   wait; m=$(tail -1 /tmp/m8.txt); log "gguf $m"
   $B/llama-bench -m $m -fa 1 -ngl 99 -p 0 -n 8 -r 1 -ctk turbo3 -ctv q8_0 -v > $OUT/rope-turbo3-q8_0.txt 2>&1
   log "rope check turbo3/q8_0: rc=$? | $(grep -c "Q's RoPE done by the decode attention kernel" $OUT/rope-turbo3-q8_0.txt) Q-RoPE lines"
   bench b32 --types f16,turbo3,turbo4,q8_0/turbo3,f16/turbo3,turbo3/q8_0 --depths 0,32768 -p 512 -n 128 -r 1 --rounds 2 --out $OUT/b32
   [ $(( $(date +%s) - T0 )) -gt ${DL128:-9999} ] && log "deadline: skip bench b128" || bench b128 --types f16,turbo3,turbo4 --depths 131072 -p 0 -n 64 -r 1 --rounds 1 --out $OUT/b128
   [ $ph = P2 ] && continue
   for t in f16 turbo3; do late "slots $t" && continue
     $B/llama-batched-bench -m $m -c $((4*(32768+128))) -b 2048 -ub 512 -npp 32768 -ntg 128 -npl 4 -fa on -ngl 99 -ctk $t -ctv $t > $OUT/bb-$t.txt 2>&1
     log "llama-batched-bench -npp 32768 -ntg 128 -npl 4 -ctk $t -ctv $t: rc=$? | $(grep -E '^\|\s+32768' $OUT/bb-$t.txt | tr -s ' ')"; done
   FA='nh=8,nr23=\[4,1\],kv=KV,nb=1,.*type_K=turbo3,type_V=turbo3'
   ncu1 fa-turbo3-32k k_turbo_fattn_mma $B/test-backend-ops perf -b CUDA0 -o FLASH_ATTN_EXT -p "${FA/KV/32768}"
   ncu1 fa-turbo3-128k k_turbo_fattn_mma $B/test-backend-ops perf -b CUDA0 -o FLASH_ATTN_EXT -p "${FA/KV/131072}"
   ncu1 write-turbo3 k_turbo_set_rows_t2 $B/test-backend-ops perf -b CUDA0 -o SET_ROWS -p 'type_dst=turbo3,.*ne=\[1024,4096,1,1\]'
   ncu1 fa-f16-32k flash_attn $B/test-backend-ops perf -b CUDA0 -o FLASH_ATTN_EXT -p 'nh=8,nr23=\[4,1\],kv=32768,nb=1,.*type_K=f16,type_V=f16' ;;
esac; done
log "done"
