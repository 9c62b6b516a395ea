#!/usr/bin/env bash
# run 37 (lead, 2026-12-03):
#   M  (calls 1-3) branch mulfold (patches 0001-0055: llama's q*D / k/D MUL taken by the fused RoPE kernels), binaries built on
#      the CPU machine (ci/make-prebuilt.sh, carried as .devcarry/prebuilt.tar.gz): ci/gpu-run.sh's tests, the fusion's
#      log lines, turbo3 / turbo4 against f16 (turbo-llama bench, depths 0 and 32K), turbo3 with and without the MULs
#      in one binary (TURBO_K_RESCALE=0 takes them out of the graph), and every kernel of a depth-0 decode step timed
#      per name (ncu + ci/ktime.py) for f16 and turbo3
#   F1 main with every K/V pair on the tensor cores (binaries from ci/make-prebuilt.sh again): ci/gpu-run.sh's tests
#      and kernel perf cases, then issue #29's table (turbo-llama bench --shape llama8b --rounds 3)
#   F2 the same machine: four slots at 32K each
#      (llama-batched-bench, three rounds), the decode op at head size 256 of every pair with a plain side (patch
#      0056's perf cases) and f16 / turbo4 against turbo4 / f16 in llama-bench at 32K
#   F3 the same machine: tg64 at 128K (turbo-llama bench, --rounds RR128, default 3)
# DL: no new step after this many seconds
set -u
R=$(pwd); W=/tmp/r37; mkdir -p $W; S=$OUT/summary.txt; T0=$(date +%s); DL=${DL:-540}
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $S; }
late() { [ $(( $(date +%s) - T0 )) -gt $DL ] && { log "deadline: skip $*"; return 0; }; return 1; }
# the device tool returns at most 8 files: the logs go to $W, and $OUT gets summary.txt (written as the run goes, so a
# call that runs out of time keeps it) and logs.tgz
trap 'tar czf $OUT/logs.tgz -C $W .' EXIT
B=/tmp/tl/build/bin; GG=/tmp/tl/tree/gguf-py; SH=/tmp/tlcache/shapes
# the carried binaries find their libraries here (calls F1 and F3 of run 37 stopped their benches at once without it:
# the bench of F1 was run again by hand in the same lease, F3 with it exported)
export LD_LIBRARY_PATH="$B:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
M8() { PYTHONPATH=$R/python:$GG python3 -c "from pathlib import Path; from turbo_llama.shapes import shape_gguf; print(shape_gguf('llama8b', Path('$SH')))"; }
bench() { # turbo-llama bench through the product's command with this machine's binaries; $1: a label
  local lab=$1; shift; late "bench $lab" && return
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .devcarry/whl/*.whl > /dev/null 2>&1
  PYTHONPATH=/tmp/site:$R/python:$GG TURBO_LLAMA_BIN_DIR=$B TURBO_LLAMA_CACHE=/tmp/tlcache TURBO_LLAMA_DATA=$R \
    PYTHONUNBUFFERED=1 python3 -m turbo_llama bench --shape llama8b --backend cuda "$@" > $W/bench-$lab.txt 2>&1
  log "turbo-llama bench --shape llama8b --backend cuda $*: rc=$?"; grep -E "^\|" $W/bench-$lab.txt | tee -a $S
}
ktime() { # label, env assignments..., then llama-bench's -ctk/-ctv type: every kernel of 8 depth-0 decode steps
  local lab=$1 t=$2; shift 2; late "ktime $lab" && return
  env "$@" GGML_CUDA_DISABLE_GRAPHS=1 timeout 150 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum \
    --csv --print-units base $B/llama-bench -m $m -p 0 -n 8 -r 1 -fa 1 -ngl 99 -ctk $t -ctv $t --no-warmup > $W/ktime-$lab.csv 2> $W/ktime-$lab.err
  log "ktime $lab ($* -ctk $t -ctv $t, llama8b, depth 0, 8 tokens): rc=$?"
  python3 ci/ktime.py $W/ktime-$lab.csv 8 2>&1 | head -24 | tee -a $S
}
for ph in "$@"; do case $ph in
M) mkdir -p /tmp/tl && tar xzf .devcarry/mini.tar.gz -C /tmp/tl
   ( M8 > /tmp/m8.txt 2>&1 ) &   # the 4.3 GB random GGUF while the tests run
   TL_PERF= TL_BUILD=prebuilt OUT=$W/m bash ci/gpu-run.sh build test > $W/m.txt 2>&1; cat $W/m/summary.txt >> $S
   wait; m=$(tail -1 /tmp/m8.txt); log "gguf $m"
   for t in turbo3 turbo3/q8_0 turbo4; do k=${t%/*}; v=${t#*/}
     $B/llama-bench -m $m -fa 1 -ngl 99 -p 0 -n 8 -r 1 -ctk $k -ctv $v -v > $W/fuse-$k-$v.txt 2>&1
     log "fusion lines $t: rc=$? | Q RoPE $(grep -c "Q's RoPE done by the decode attention kernel" $W/fuse-$k-$v.txt), MUL before Q's $(grep -c "MUL before Q's RoPE done" $W/fuse-$k-$v.txt), K RoPE $(grep -c "K's RoPE done by the turbo K write" $W/fuse-$k-$v.txt), MUL before K's $(grep -c "MUL before K's RoPE done" $W/fuse-$k-$v.txt)"; done
   bench b32 --types f16,turbo3,turbo4 --depths 0,32768 -p 512 -n 128 -r 1 --rounds 2 --out $W/b32
   # the same binary with the MULs in the graph or not (TURBO_K_RESCALE=0: no q*D, k/D; speed only), two rounds
   for r in 1 2; do for e in TURBO_K_RESCALE=1 TURBO_K_RESCALE=0; do late "ab $e" && continue
     env $e $B/llama-bench -m $m -fa 1 -ngl 99 -p 0 -n 128 -r 1 -d 0,32768 -ctk turbo3 -ctv turbo3 -o md > $W/ab-$r-$e.md 2>&1
     log "ab round $r $e turbo3: $(grep -E 'tg128' $W/ab-$r-$e.md | tr -s ' ' | cut -d'|' -f8- | tr '\n' ' ')"; done; done
   ktime f16 f16
   ktime turbo3 turbo3
   ktime turbo3-norescale turbo3 TURBO_K_RESCALE=0 ;;
F1) mkdir -p /tmp/tl && tar xzf .devcarry/mini.tar.gz -C /tmp/tl
   ( M8 > /tmp/m8.txt 2>&1 ) &
   TL_BUILD=prebuilt OUT=$W/f1 bash ci/gpu-run.sh build test > $W/f1.txt 2>&1; cat $W/f1/summary.txt >> $S
   wait; m=$(tail -1 /tmp/m8.txt); log "gguf $m"
   bench b32 --types f16,turbo3,turbo4,q8_0/turbo3,f16/turbo3,turbo3/q8_0 --depths 0,32768 -p 512 -n 128 -r 1 --rounds 3 --out $W/b32 ;;
F2) m=$(tail -1 /tmp/m8.txt)
   for r in 1 2 3; do for t in f16 turbo3; do late "slots $t round $r" && continue
     $B/llama-batched-bench -m $m -c $((4*(32768+128))) -b 2048 -ub 512 -npp 32768 -ntg 128 -npl 4 -fa on -ngl 99 -ctk $t -ctv $t > $W/bb-$t-$r.txt 2>&1
     log "llama-batched-bench -npp 32768 -ntg 128 -npl 4 -ctk $t -ctv $t (round $r): rc=$? | $(grep -E '^\|\s+32768' $W/bb-$t-$r.txt | tr -s ' ')"; done; done
   $B/test-backend-ops perf -b CUDA0 -o FLASH_ATTN_EXT -p 'hsk=256,hsv=256,nh=4,nr23=\[2,1\],kv=32768,nb=1,' > $W/pairs-perf.txt 2>&1
   log "pairs perf: rc=$?"; sed 's/\x1b\[[0-9;]*m//g' $W/pairs-perf.txt | grep -E "us/run" | sed -E 's/max_bias=.*type_K=/type_K=/; s/,permute=[^)]*//' >> $S
   late "pairs bench" || { $B/llama-bench -m $m -fa 1 -ngl 99 -p 0 -n 128 -d 32768 -r 1 -ctk f16,turbo4 -ctv f16,turbo4 -o md > $W/pairs-bench.md 2>&1
     log "llama-bench -fa 1 -ngl 99 -p 0 -n 128 -d 32768 -r 1 -ctk f16,turbo4 -ctv f16,turbo4: rc=$?"; grep -E "tg128|type_k" $W/pairs-bench.md >> $S; }
   ;;
F3) bench b128 --types f16,turbo3,turbo4 --depths 131072 -p 0 -n 64 -r 1 --rounds ${RR128:-3} --out $W/b128 ;;
esac; done
log "done"
