#!/usr/bin/env bash
# run 39 (lead, 2026-12-03):
#   A  branch ab39 (harness, not for main) = branch ropeq-streams (several KV streams' Q RoPE + MUL done by the
#      decode kernel, patch 0058's test cases) + two same-binary switches: TURBO_ROPEQ_STREAMS=0 keeps those graphs'
#      RoPE unfused (main's behaviour), TURBO_EPI_PAD=0 stores the decode epilogue unpadded (main before c2facf5).
#      Binaries built on the CPU machine (ci/make-prebuilt.sh). ci/gpu-run.sh's tests with the defaults (what would
#      merge); four slots at 32K each (llama-batched-bench, issue #29's command) f16 / turbo3 / turbo3 unfused
#      alternating; llama-bench turbo3 with and without TURBO_PDL_AB=1 (the turbo write, attention and merge launched
#      with PDL as upstream launches its kernels; the attention kernel without its early trigger), f16 beside.
#      (A first version of this phase, with the epilogue A/B, ran ~6 minutes and was lost: the machine was taken back.)
#   B  the same binaries: what limits the four-slot and depth-0 rows. f16's four-stream decode kernel timed by name
#      (upstream's flash_attn_ext_f16, launches after the 4 x 32K prefill's), ncu --set full of turbo3's decode
#      kernel at 4 x 32K, and of both attention kernels (turbo3's and f16's flash_attn_ext_vec) at depth 0
#   D  B's depth-0 part alone (B's four-slot f16 timing under ncu ran past its 200 s: the 4 x 32K prefill)
#   E  TURBO_PDL_AB=0 / 1 alternating, turbo3 at depths 0 and 32K (two rounds), and at 128K
#   F  f16 and turbo3 at 128K, one llama-bench each, one after the other
#   C  issue #29's bench with three rounds (turbo-llama bench ... --rounds 3) at depths 0 and 32K, and at 128K (not run:
#      the session's device time was spent)
# DL: no new step after this many seconds
set -u
R=$(pwd); W=/tmp/r39; mkdir -p $W; S=$OUT/summary.txt; T0=$(date +%s); DL=${DL:-540}
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $S; }
late() { [ $(( $(date +%s) - T0 )) -gt $DL ] && { log "deadline: skip $*"; return 0; }; return 1; }
trap 'tar czf $OUT/logs.tgz -C $W .' EXIT
B=/tmp/tl/build/bin; GG=/tmp/tl/tree/gguf-py; SH=/tmp/tlcache/shapes
export LD_LIBRARY_PATH="$B:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
M8() { PYTHONPATH=$R/python:$GG python3 -c "from pathlib import Path; from turbo_llama.shapes import shape_gguf; print(shape_gguf('llama8b', Path('$SH')))"; }
bb() { $B/llama-batched-bench -m $m -c $((4*($1+$2+16))) -b 2048 -ub 512 -npp $1 -ntg $2 -npl 4 -fa on -ngl 99 -ctk $3 -ctv $3; }
bbline() { grep -E '^\|\s+[0-9]+ \|' "$1" | tail -1 | tr -s ' '; }
NCUM="regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum"
STALL='smsp__average_warps_issue_stalled_(long_scoreboard|short_scoreboard|wait|barrier|math_pipe_throttle|mio_throttle|lg_throttle|no_instruction|branch_resolving|dispatch_stall|membar|drain|imc_miss|not_selected|selected)_per|smsp__inst_executed.sum|Issue Slots Busy|Eligible Warps|Active Warps Per|No Eligible|Executed Ipc A'
nculine() { grep -E '^ +(Duration|Memory Throughput|DRAM Throughput|L2 Hit Rate|Achieved Occupancy|Registers Per Thread|Grid Size|Block Size) ' "$1" | tr -s ' ' | tr '\n' ';' | head -c 600; }
bench() { # turbo-llama bench through the product's command with this machine's binaries; $1: a label
  local lab=$1; shift; late "bench $lab" && return
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .devcarry/whl/*.whl > /dev/null 2>&1
  PYTHONPATH=/tmp/site:$R/python:$GG TURBO_LLAMA_BIN_DIR=$B TURBO_LLAMA_CACHE=/tmp/tlcache TURBO_LLAMA_DATA=$R \
    PYTHONUNBUFFERED=1 python3 -m turbo_llama bench --shape llama8b --backend cuda "$@" > $W/bench-$lab.txt 2>&1
  log "turbo-llama bench --shape llama8b --backend cuda $*: rc=$?"; grep -E "^\|" $W/bench-$lab.txt | tee -a $S
}
KT="--clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --print-units base"
for ph in "$@"; do case $ph in
A) mkdir -p /tmp/tl && tar xzf .devcarry/mini.tar.gz -C /tmp/tl
   ( M8 > /tmp/m8.txt 2>&1 ) &
   TL_PERF= TL_BUILD=prebuilt OUT=$W/a bash ci/gpu-run.sh build test > $W/a.txt 2>&1; cat $W/a/summary.txt >> $S
   wait; m=$(tail -1 /tmp/m8.txt); log "gguf $m"
   for v in f16:1 turbo3:1 turbo3:0 turbo3:1 turbo3:0; do t=${v%:*}; rs=${v#*:}; late "slots $v" && continue
     f=$W/slots-$t-$rs-$(date +%s).txt
     TURBO_ROPEQ_STREAMS=$rs bb 32768 128 $t > $f 2>&1
     log "four slots 4 x 32768 -ntg 128 $t TURBO_ROPEQ_STREAMS=$rs: rc=$? $(bbline $f) | $(grep -c "Q's RoPE done by the decode" $f) fusion lines"; done
   for v in turbo3:TURBO_PDL_AB=0 turbo3:TURBO_PDL_AB=1 f16:TURBO_PDL_AB=0; do t=${v%%:*}; e=${v#*:}; late "ab $v" && continue
     env $e $B/llama-bench -m $m -fa 1 -ngl 99 -p 0 -n 128 -d 0,32768 -r 2 -ctk $t -ctv $t -o md > $W/ab-$t-${e//=/}.txt 2>&1
     log "llama-bench $t $e: rc=$? | $(grep -E 'tg128' $W/ab-$t-${e//=/}.txt | awk -F'|' '{print $(NF-2) "->" $(NF-1)}' | tr -s ' ' | tr '\n' ';')"; done ;;
B) m=$(tail -1 /tmp/m8.txt); log "gguf $m"
   # prefill: 4 x 32768 tokens in ubatches of 512 = 256 ubatches x 32 layers of flash_attn_ext_f16; the grid size
   # column tells the decode launches from the prefill's
   late "f16 slots" || { GGML_CUDA_DISABLE_GRAPHS=1 timeout 200 ncu --clock-control none --cache-control none -k regex:flash_attn \
       --launch-skip 8192 --launch-count 512 --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size --csv --print-units base \
       bash -c "$(declare -f bb); B=$B m=$m bb 32768 8 f16" > $W/slots-f16.csv 2> $W/slots-f16.err
     log "f16 four slots, flash_attn kernels after 8192 launches: rc=$?"
     python3 - $W/slots-f16.csv <<'PY' 2>&1 | tee -a $S
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
h = rows[0]; ix = {k: h.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
by = collections.defaultdict(dict)
for r in rows[1:]:
    by[(r[ix["ID"]], r[ix["Kernel Name"]].split("(")[0][:60])][r[ix["Metric Name"]]] = r[ix["Metric Value"]]
agg = collections.defaultdict(list)
for (i, name), m in by.items():
    agg[(name, m.get("launch__grid_size"), m.get("launch__block_size"))].append(float(m["gpu__time_duration.sum"].replace(",", "")))
for (name, gs, bs), v in sorted(agg.items(), key=lambda kv: -sum(kv[1])):
    print(f"  {len(v):4d} x {sum(v)/len(v)/1e3:8.2f} us  grid {gs} block {bs}  {name}")
PY
   }
   late "slots ncu" || { timeout 150 ncu --clock-control none --set full -k regex:k_turbo_fattn_mma -s 32 -c 1 --metrics "$NCUM" \
       bash -c "$(declare -f bb); B=$B m=$m bb 32768 8 turbo3" > $W/slots-ncu.txt 2>&1
     log "ncu turbo3 decode at 4 x 32K: rc=$? | $(nculine $W/slots-ncu.txt)"; grep -E "$STALL" $W/slots-ncu.txt | tr -s ' ' | head -30 >> $S; }
   ;;
D) m=$(tail -1 /tmp/m8.txt 2>/dev/null); [ -f "$m" ] || { mkdir -p /tmp/tl && tar xzf .devcarry/mini.tar.gz -C /tmp/tl; TL_PERF= TL_BUILD=prebuilt OUT=$W/d bash ci/gpu-run.sh build > $W/d.txt 2>&1; M8 > /tmp/m8.txt 2>&1; m=$(tail -1 /tmp/m8.txt); }
   for k in k_turbo_fattn_mma:turbo3 k_turbo_fattn_combine:turbo3 flash_attn_ext_vec:f16 flash_attn_combine:f16; do n=${k%:*}; t=${k#*:}; late "d0 ncu $k" && continue
     timeout 100 ncu --clock-control none --set full -k regex:$n -s 64 -c 1 --metrics "$NCUM" \
       $B/llama-bench -m $m -p 0 -n 8 -d 0 -r 1 -fa 1 -ngl 99 -ctk $t -ctv $t --no-warmup > $W/d0-ncu-$n.txt 2>&1
     log "ncu $n ($t) depth 0: rc=$? | $(nculine $W/d0-ncu-$n.txt)"; grep -E "$STALL" $W/d0-ncu-$n.txt | tr -s ' ' | head -30 >> $S; done ;;
E) m=$(tail -1 /tmp/m8.txt)
   for v in 0 1 0 1; do late "pdl $v" && continue
     TURBO_PDL_AB=$v $B/llama-bench -m $m -fa 1 -ngl 99 -p 0 -n 128 -d 0,32768 -r 2 -ctk turbo3 -ctv turbo3 -o md > $W/pdl-$v-$(date +%s).txt 2>&1
     log "llama-bench turbo3 TURBO_PDL_AB=$v: rc=$? | $(grep -E 'tg128' $(ls -t $W/pdl-$v-*.txt | head -1) | awk -F'|' '{print $(NF-2) "->" $(NF-1)}' | tr -s ' ' | tr '\n' ';')"; done
   for v in 0 1; do late "pdl 128K $v" && continue
     TURBO_PDL_AB=$v $B/llama-bench -m $m -fa 1 -ngl 99 -p 0 -n 64 -d 131072 -r 1 -ctk turbo3 -ctv turbo3 -o md > $W/pdl128-$v.txt 2>&1
     log "llama-bench turbo3 128K TURBO_PDL_AB=$v: rc=$? | $(grep -E 'tg64' $W/pdl128-$v.txt | awk -F'|' '{print $(NF-2) "->" $(NF-1)}' | tr -s ' ' | tr '\n' ';')"; done ;;
F) m=$(tail -1 /tmp/m8.txt)   # (run as this one command line, F/f128.txt)
   for t in f16 turbo3; do $B/llama-bench -m $m -fa 1 -ngl 99 -p 0 -n 64 -d 131072 -r 1 -ctk $t -ctv $t -o md 2>&1 | grep -E "tg64|build" | tee -a $OUT/f128.txt; done ;;
C) bench c --types f16,turbo3,turbo4,q8_0/turbo3,f16/turbo3 --depths 0,32768 -p 512 -n 128 -r 1 --rounds 3 --out $W/bc
   bench c128 --types f16,turbo3,turbo4 --depths 131072 -p 0 -n 64 -r 1 --rounds 2 --out $W/bc128 ;;
esac; done
log "done"
