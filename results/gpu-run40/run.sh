#!/usr/bin/env bash
# run 40 (lead, 2026-12-03). Binaries built on the CPU machine by ci/make-prebuilt.sh: main (ad3df70's code, cuda/
# unchanged since 98bb670) and branch ropeload (the fused RoPEs' global loads issued with the kernel's inputs).
#   A  (carries main's binaries) unpack them to /tmp/tlA; write the random llama8b GGUF and a copy with Llama 3's
#      rope_freqs tensor (all factors 1.0: the speed is the same for any values; the kernels then read them)
#   B  (carries ropeload's) unpack to /tmp/tlB; ropeload's tests (bit-exact write, SET_ROWS, SUB_SET_ROWS, CPY,
#      GET_ROWS, ROPE_FLASH_ATTN, FLASH_ATTN_EXT: ci/gpu-run.sh's list)
#   X  A/B at depth 0: llama-bench tg128 of turbo3, main's and ropeload's binaries alternating, each model; f16 beside
#   K  A/B at depth 0: the turbo3 kernels of 8 decode steps timed by ncu, each binary and model
#   C  issue #29's command with three rounds at depths 0 and 32K (every pair of the table), binaries of $TL (A or B)
#   H  the same at 128K (tg64)
#   D  depth 0 again: f16 and turbo3, five rounds (then X once more: the A/B's rounds 3 and 4)
#   T  (carries .devcarry/pristine.tar.gz: the pinned upstream tree as the sdist holds it) the product's own
#      `turbo-llama build --cuda --llama-src` on a fresh machine, then its llama-bench with turbo3 on a tiny random GGUF
#   S  four slots at 32K each (llama-batched-bench), f16 and turbo3 alternating, two rounds
# DL: no new step after this many seconds
set -u
R=$(pwd); W=/tmp/r40; mkdir -p $W; S=$OUT/summary.txt; T0=$(date +%s); DL=${DL:-540}
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $S; }
late() { [ $(( $(date +%s) - T0 )) -gt $DL ] && { log "deadline: skip $*"; return 0; }; return 1; }
trap 'tar czf $OUT/logs.tgz -C $W .' EXIT
GG=/tmp/tl/tree/gguf-py; SH=/tmp/tlcache/shapes
use() { B=/tmp/tl$1/build/bin; export LD_LIBRARY_PATH="$B:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib"; }
use ${TL:-B}
unpack() { mkdir -p /tmp/tl$1/build && tar xzf .devcarry/prebuilt.tar.gz -C /tmp/tl$1/build && log "binaries $1: $(ls /tmp/tl$1/build/bin | wc -l) files"; }
M8=$SH/random-llama8b-q4_0.gguf; MF=$SH/random-llama8bf-q4_0.gguf
gguf() { PYTHONPATH=$R/python:$GG python3 - "$SH" <<'PY'
import inspect, sys
from pathlib import Path
import turbo_llama.shapes as sh
sh.shape_gguf('llama8b', Path(sys.argv[1]))
# the same shape with Llama 3's rope_freqs tensor (written as ones by the 1-D tensor path)
src = inspect.getsource(sh.write_random_gguf).replace('plan += [("output_norm.weight", E)',
                                                      'plan += [("rope_freqs.weight", D // 2), ("output_norm.weight", E)')
ns = dict(vars(sh)); exec(src, ns)
ns['write_random_gguf'](sh.SHAPES['llama8b'], Path(sys.argv[1]) / 'random-llama8bf-q4_0.gguf')
PY
}
bench() { # issue #29's command through the product's `turbo-llama bench` with this machine's binaries; $1: a label
  local lab=$1; shift; late "bench $lab" && return
  local left=$(( DL + 40 - $(date +%s) + T0 ))   # SIGINT at the end: bench writes what finished (status interrupted)
  PYTHONPATH=$R/python:$GG TURBO_LLAMA_BIN_DIR=$B TURBO_LLAMA_CACHE=/tmp/tlcache TURBO_LLAMA_DATA=$R \
    PYTHONUNBUFFERED=1 timeout -s INT $left python3 -m turbo_llama bench --shape llama8b --backend cuda "$@" > $W/bench-$lab.txt 2>&1
  log "[$TL] turbo-llama bench --shape llama8b --backend cuda $*: rc=$?"; grep -E "^\|" $W/bench-$lab.txt | tee -a $S
}
tg() { grep -E 'tg128' "$1" | awk -F'|' '{print $(NF-1)}' | tr -s ' ' | tr '\n' ';'; }
kt() { # $1 bin set, $2 model, $3 label: the turbo3 kernels of 8 depth-0 decode steps, mean us per launch by name
  use $1; GGML_CUDA_DISABLE_GRAPHS=1 timeout 120 ncu --clock-control none --cache-control none -k regex:k_turbo \
    --metrics gpu__time_duration.sum --csv --print-units base $B/llama-bench -m $2 -p 0 -n 8 -r 1 -fa 1 -ngl 99 \
    -ctk turbo3 -ctv turbo3 --no-warmup > $W/kt-$3.csv 2> $W/kt-$3.err
  log "ncu turbo3 depth 0 [$1 $3]: rc=$? | $(python3 $R/ci/ktime.py $W/kt-$3.csv 8 2>&1 | grep -E 'k_turbo_(fattn_mma|set_rows|fattn_combine_warp)$' | tr -s ' ' | tr '\n' ';')"
}
bb() { $B/llama-batched-bench -m $M8 -c $((4*(32768+128+16))) -b 2048 -ub 512 -npp 32768 -ntg 128 -npl 4 -fa on -ngl 99 -ctk $1 -ctv $1; }
for ph in "$@"; do case $ph in
A) mkdir -p /tmp/tl && tar xzf .devcarry/mini.tar.gz -C /tmp/tl; unpack A
   gguf > $W/gguf.txt 2>&1; log "gguf: rc=$? $(ls -la $SH | tr -s ' ' | cut -d' ' -f5,9 | tr '\n' ' ')" ;;
B) unpack B; use B
   $B/test-turbo-cuda > $W/bitexact.log 2>&1; log "test-turbo-cuda rc=$? | $(grep 'BITEXACT [PF]' $W/bitexact.log)"
   for spec in "SET_ROWS|turbo" "SUB_SET_ROWS|turbo" "CPY|type_dst=turbo|type_src=turbo[234](_64)?,type_dst=f32" "GET_ROWS|turbo" \
               "ROPE_FLASH_ATTN|turbo" "FLASH_ATTN_EXT|turbo"; do op=${spec%%|*}; f=${spec#*|}
     late "test $op" && continue
     $B/test-backend-ops -b CUDA0 -o $op -p "$f" > $W/tbo-$op.log 2>&1
     log "test-backend-ops -b CUDA0 -o $op -p '$f': rc=$? | $(grep -E 'tests passed' $W/tbo-$op.log | tail -1) | FAIL lines $(grep -c FAIL $W/tbo-$op.log)"; done;;
X) for r in ${XR:-1 2}; do for m in $M8:plain $MF:ropefreqs; do for v in A B; do late "ab $v" && continue; use $v
     $B/llama-bench -m ${m%:*} -fa 1 -ngl 99 -p 0 -n 128 -r 3 -ctk turbo3 -ctv turbo3 -o md > $W/ab-$v-${m#*:}-$r.md 2>&1
     log "llama-bench turbo3 depth 0 -r 3 [$v ${m#*:} round $r]: rc=$? | $(tg $W/ab-$v-${m#*:}-$r.md)"; done; done; done
   use B; for m in $M8:plain $MF:ropefreqs; do late "f16" && continue
     $B/llama-bench -m ${m%:*} -fa 1 -ngl 99 -p 0 -n 128 -r 3 -ctk f16 -ctv f16 -o md > $W/ab-f16-${m#*:}.md 2>&1
     log "llama-bench f16 depth 0 -r 3 [${m#*:}]: rc=$? | $(tg $W/ab-f16-${m#*:}.md)"; done ;;
K) for m in $M8:plain $MF:ropefreqs; do for v in A B; do late "kt $v" || kt $v ${m%:*} $v-${m#*:}; done; done ;;
C) bench c32 --types f16,turbo3,turbo4,q8_0/turbo3,f16/turbo3 --depths 0,32768 -p 512 -n 128 -r 1 --rounds 3 --out $W/c32 ;;
H) bench c128 --types f16,turbo3,turbo4 --depths 131072 -p 0 -n 64 -r 1 --rounds 3 --out $W/c128 ;;
D) bench d0 --types f16,turbo3 --depths 0 -p 512 -n 128 -r 1 --rounds 5 --out $W/d0 ;;
S) for r in 1 2; do for t in f16 turbo3; do late "slots $t $r" && continue
     bb $t > $W/slots-$t-$r.txt 2>&1
     log "[$TL] llama-batched-bench -npp 32768 -ntg 128 -npl 4 -ctk $t -ctv $t (round $r): rc=$? | $(grep -E '^\|\s+32768' $W/slots-$t-$r.txt | tr -s ' ')"; done; done ;;
T) mkdir -p /tmp/tl /tmp/tlp && tar xzf .devcarry/mini.tar.gz -C /tmp/tl && tar xzf .devcarry/pristine.tar.gz -C /tmp/tlp
   PYTHONPATH=$R/python:$GG TURBO_LLAMA_CACHE=/tmp/tlcache timeout 480 python3 -m turbo_llama build --cuda --cuda-arch 90 \
     --llama-src /tmp/tlp --target llama-bench --no-install --build-dir /tmp/tlpb > $W/tlbuild.log 2>&1
   log "turbo-llama build --cuda --cuda-arch 90 --llama-src pristine --target llama-bench --no-install: rc=$? | $(grep -E 'patch|built|error' $W/tlbuild.log | tail -3 | tr '\n' ' ')"
   PYTHONPATH=$R/python:$GG python3 -c "from pathlib import Path; from turbo_llama.shapes import shape_gguf; print(shape_gguf('tiny', Path('$SH')))" > $W/tiny.txt 2>&1
   tb=$(find /tmp/tlpb -name llama-bench -type f | head -1)
   $tb -m $(tail -1 $W/tiny.txt) -fa 1 -ngl 99 -p 64 -n 16 -r 1 -ctk f16,turbo3 -ctv f16,turbo3 -o md > $W/tlbench.md 2>&1
   log "$tb turbo3 on the tiny GGUF: rc=$?"; grep -E "turbo3|f16|CUDA" $W/tlbench.md | head -8 | tee -a $S ;;
esac; done
log "done"
