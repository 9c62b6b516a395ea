#!/usr/bin/env bash
# run 38 (lead, 2026-12-03):
#   P  main 282a5aa + patch 0057 (a decode perf case in the KV cache's own layout), binaries built on the CPU machine
#      (ci/make-prebuilt.sh, carried as .devcarry/prebuilt.tar.gz): where turbo3's ~8 us per layer at 32K go.
#      The decode op at 32K keys in both layouts (test-backend-ops perf), ncu --set full of the turbo3 decode in the
#      cache layout and inside llama-bench's graph at depth 32K, and the decode attention's kernels of 8 steps at
#      depth 32K timed per name (ncu + ci/ktime.py) for f16 and turbo3
#   Q  the same binaries: where four slots' decode step goes (llama-batched-bench -npl 4, one KV stream per sequence):
#      the attention kernels of 8 steps at 32K each, every kernel of 8 steps at 512 each (the rest of a step does not
#      depend on the depth), per name, for f16 and turbo3; ncu --set full of the turbo3 decode kernel at 4 x 32K
#      (as it ran: f16's attention matched none of the names, every-kernel ktime hit its 200 s timeout, the ncu was
#      past the deadline; Q/summary.txt)
#   E  branch epibank (the epilogue's O^T stores padded to 32 banks, cuda/fattn-turbo-mma.cuh; binaries as above):
#      ci/gpu-run.sh's tests, the decode op at 32K and 128K, the epilogue's shared-store wavefronts (ncu), the attention
#      kernels of 8 depth-0 steps (ktime), and turbo-llama bench f16 / turbo3 / turbo4 at depths 0 and 32K
# DL: no new step after this many seconds
set -u
R=$(pwd); W=/tmp/r38; mkdir -p $W; S=$OUT/summary.txt; T0=$(date +%s); DL=${DL:-540}
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $S; }
late() { [ $(( $(date +%s) - T0 )) -gt $DL ] && { log "deadline: skip $*"; return 0; }; return 1; }
# the device tool returns at most 8 files: logs go to $W, $OUT gets summary.txt (written as the run goes) and logs.tgz
trap 'tar czf $OUT/logs.tgz -C $W .' EXIT
B=/tmp/tl/build/bin; GG=/tmp/tl/tree/gguf-py; SH=/tmp/tlcache/shapes
export LD_LIBRARY_PATH="$B:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
M8() { PYTHONPATH=$R/python:$GG python3 -c "from pathlib import Path; from turbo_llama.shapes import shape_gguf; print(shape_gguf('llama8b', Path('$SH')))"; }
bench() { # turbo-llama bench through the product's command with this machine's binaries; $1: a label
  local lab=$1; shift; late "bench $lab" && return
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .devcarry/whl/*.whl > /dev/null 2>&1
  PYTHONPATH=/tmp/site:$R/python:$GG TURBO_LLAMA_BIN_DIR=$B TURBO_LLAMA_CACHE=/tmp/tlcache TURBO_LLAMA_DATA=$R \
    PYTHONUNBUFFERED=1 python3 -m turbo_llama bench --shape llama8b --backend cuda "$@" > $W/bench-$lab.txt 2>&1
  log "turbo-llama bench --shape llama8b --backend cuda $*: rc=$?"; grep -E "^\|" $W/bench-$lab.txt | tee -a $S
}
NCUM="regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum"
nculine() { grep -E '^ +(Duration|Memory Throughput|DRAM Throughput|L2 Hit Rate|L1/TEX Hit Rate|Mem Busy|Max Bandwidth|Achieved Occupancy|Registers Per Thread|Grid Size) ' "$1" | tr -s ' ' | tr '\n' ';' | head -c 600; }
for ph in "$@"; do case $ph in
P) mkdir -p /tmp/tl && tar xzf .devcarry/mini.tar.gz -C /tmp/tl
   ( M8 > /tmp/m8.txt 2>&1 ) &   # the 4.3 GB random GGUF while the op runs
   TL_BUILD=prebuilt OUT=$W/p bash ci/gpu-run.sh build > $W/p.txt 2>&1; cat $W/p/summary.txt >> $S
   $B/test-backend-ops perf -b CUDA0 -o FLASH_ATTN_EXT -p 'hsk=128,hsv=128,nh=8,nr23=\[4,1\],kv=32768,nb=1,' > $W/perf.txt 2>&1
   log "perf FLASH_ATTN_EXT 32K: rc=$?"; sed 's/\x1b\[[0-9;]*m//g' $W/perf.txt | grep -E "us/run" | sed -E 's/max_bias=.*type_K=/type_K=/; s/,kv_view.*\)/)/' >> $S
   for pm in '0,1,2,3' '0,2,1,3'; do late "ncu $pm" && continue
     timeout 150 ncu --clock-control none --set full -k regex:k_turbo_fattn_mma -c 1 --metrics "$NCUM" \
       $B/test-backend-ops perf -b CUDA0 -o FLASH_ATTN_EXT -p "nh=8,nr23=\[4,1\],kv=32768,nb=1,.*type_K=turbo3,type_V=turbo3,permute=\[$pm\]" > $W/ncu-op-$pm.txt 2>&1
     log "ncu turbo3 op 32K permute $pm: rc=$? | $(nculine $W/ncu-op-$pm.txt)"; done
   wait; m=$(tail -1 /tmp/m8.txt); log "gguf $m"
   late "ncu graph" || { timeout 200 ncu --clock-control none --set full -k regex:k_turbo_fattn_mma -c 1 --metrics "$NCUM" \
       $B/llama-bench -m $m -p 0 -n 2 -d 32768 -r 1 -fa 1 -ngl 99 -ctk turbo3 -ctv turbo3 --no-warmup > $W/ncu-graph.txt 2>&1
     log "ncu turbo3 in llama-bench's graph, depth 32K: rc=$? | $(nculine $W/ncu-graph.txt)"; }
   for t in f16 turbo3; do late "ktime $t" && continue
     GGML_CUDA_DISABLE_GRAPHS=1 timeout 200 ncu --clock-control none --cache-control none \
       -k "regex:flash_attn_ext_vec|flash_attn_combine|k_turbo_fattn" --metrics gpu__time_duration.sum --csv --print-units base \
       $B/llama-bench -m $m -p 0 -n 8 -d 32768 -r 1 -fa 1 -ngl 99 -ctk $t -ctv $t --no-warmup > $W/ktime-$t.csv 2> $W/ktime-$t.err
     log "ktime $t (llama8b, depth 32768, 8 tokens, attention kernels): rc=$?"
     python3 ci/ktime.py $W/ktime-$t.csv 8 2>&1 | head -12 | tee -a $S; done ;;
Q) if [ ! -x $B/llama-batched-bench ]; then mkdir -p /tmp/tl && tar xzf .devcarry/mini.tar.gz -C /tmp/tl
     ( M8 > /tmp/m8.txt 2>&1 ) &
     TL_BUILD=prebuilt OUT=$W/q bash ci/gpu-run.sh build > $W/q.txt 2>&1; cat $W/q/summary.txt >> $S; wait; fi
   m=$(tail -1 /tmp/m8.txt); log "gguf $m"
   bb() { $B/llama-batched-bench -m $m -c $((4*($1+16))) -b 2048 -ub 512 -npp $1 -ntg 8 -npl 4 -fa on -ngl 99 -ctk $2 -ctv $2; }
   for t in f16 turbo3; do late "slots ktime $t" && continue
     GGML_CUDA_DISABLE_GRAPHS=1 timeout 200 ncu --clock-control none --cache-control none \
       -k "regex:flash_attn_ext_vec|flash_attn_combine|k_turbo_fattn" --metrics gpu__time_duration.sum --csv --print-units base \
       bash -c "$(declare -f bb); B=$B m=$m bb 32768 $t" > $W/slots-att-$t.csv 2> $W/slots-att-$t.err
     log "ktime 4 slots $t (attention kernels, 8 steps at 4 x 32768): rc=$?"
     python3 ci/ktime.py $W/slots-att-$t.csv 8 2>&1 | head -8 | tee -a $S
     GGML_CUDA_DISABLE_GRAPHS=1 timeout 200 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --print-units base \
       bash -c "$(declare -f bb); B=$B m=$m bb 512 $t" > $W/slots-all-$t.csv 2> $W/slots-all-$t.err
     log "ktime 4 slots $t (every kernel, prefill 4 x 512 and 8 steps): rc=$?"
     python3 ci/ktime.py $W/slots-all-$t.csv 8 2>&1 | head -24 | tee -a $S
     bb 32768 $t > $W/slots-bb-$t.txt 2>&1; log "llama-batched-bench 4 x 32768 -ntg 8 $t: $(grep -E '^\|\s+32768' $W/slots-bb-$t.txt | tr -s ' ')"; done
   late "slots ncu" || { timeout 200 ncu --clock-control none --set full -k regex:k_turbo_fattn_mma -c 1 --metrics "$NCUM" \
       bash -c "$(declare -f bb); B=$B m=$m bb 32768 turbo3" > $W/slots-ncu.txt 2>&1
     log "ncu turbo3 4 slots x 32K decode: rc=$? | $(nculine $W/slots-ncu.txt)"; } ;;
E) mkdir -p /tmp/tl && tar xzf .devcarry/mini.tar.gz -C /tmp/tl
   ( M8 > /tmp/m8.txt 2>&1 ) &
   TL_PERF= TL_BUILD=prebuilt OUT=$W/e bash ci/gpu-run.sh build test > $W/e.txt 2>&1; cat $W/e/summary.txt >> $S
   $B/test-backend-ops perf -b CUDA0 -o FLASH_ATTN_EXT -p 'hsk=128,hsv=128,nh=8,nr23=\[4,1\],kv=(32768|131072),nb=1,' > $W/perf-e.txt 2>&1
   log "perf FLASH_ATTN_EXT 32K, 128K: rc=$?"; sed 's/\x1b\[[0-9;]*m//g' $W/perf-e.txt | grep -E "us/run" | sed -E 's/max_bias=.*type_K=/type_K=/; s/,kv_view.*\)/)/' >> $S
   SHM=gpu__time_duration.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
   timeout 100 ncu --clock-control none -k regex:k_turbo_fattn_mma -c 1 --metrics $SHM \
     $B/test-backend-ops perf -b CUDA0 -o FLASH_ATTN_EXT -p "nh=8,nr23=\[4,1\],kv=32768,nb=1,.*type_K=turbo3,type_V=turbo3,permute=\[0,2,1,3\]" > $W/ncu-shm.txt 2>&1
   log "ncu turbo3 op 32K (cache layout), shared memory: rc=$? | $(grep -E '^ +(gpu__|l1tex__)' $W/ncu-shm.txt | tr -s ' ' | tr '\n' ';')"
   wait; m=$(tail -1 /tmp/m8.txt); log "gguf $m"
   late "ktime d0" || { GGML_CUDA_DISABLE_GRAPHS=1 timeout 120 ncu --clock-control none --cache-control none -k "regex:k_turbo_fattn" \
       --metrics gpu__time_duration.sum --csv --print-units base $B/llama-bench -m $m -p 0 -n 8 -d 0 -r 1 -fa 1 -ngl 99 \
       -ctk turbo3 -ctv turbo3 --no-warmup > $W/ktime-e-d0.csv 2> $W/ktime-e-d0.err
     log "ktime turbo3 (llama8b, depth 0, 8 tokens, attention kernels): rc=$?"; python3 ci/ktime.py $W/ktime-e-d0.csv 8 2>&1 | head -6 | tee -a $S; }
   bench e --types f16,turbo3,turbo4 --depths 0,32768 -p 512 -n 128 -r 1 --rounds ${RR:-2} --out $W/be ;;
esac; done
log "done"
