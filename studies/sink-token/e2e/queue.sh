#!/bin/bash
# STUDY (helper-16): sink cell exact, end to end; sequential on the shared 2 cores
cd /tmp/h16
SHIP=/root/.cache/turbo-llama/build/cpu/bin/llama-perplexity
P=/tmp/h16/llama-perplexity-sink
run() {  # name model base chunks type mode binary
  local name=$1 m=$2 base=$3 ch=$4 t=$5 mode=$6 bin=$7
  STUDY_SINK=$mode nice -n 10 $bin -m $m -f jargon.txt -c 2048 --chunks $ch -fa on -t 2 -ctk $t -ctv $t \
    --kl-divergence-base $base --kl-divergence > out/$name.log 2>&1
  echo "$(date +%T) $name rc=$?" >> out/queue.done
}
Q=/work/exp/q.gguf; QB=/work/exp/q-f16-c1.kld
G=/work/exp/g.gguf; GB=/work/exp/g-f16-c4.kld
for t in turbo3 turbo2; do
  [ $t = turbo3 ] && run q-$t-ship $Q $QB 1 $t 0 $SHIP
  for mode in 0 K 1; do run q-$t-sink$mode $Q $QB 1 $t $mode $P; done
done
for t in turbo3 turbo2; do
  [ $t = turbo3 ] && run g-$t-ship $G $GB 4 $t 0 $SHIP
  for mode in 0 K 1; do run g-$t-sink$mode $G $GB 4 $t $mode $P; done
done
