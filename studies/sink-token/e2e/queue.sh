#!/bin/bash
# STUDY (helper-16): sink cell exact, end to end; sequential on the shared 2 cores
cd /tmp/h16
SHIP=/root/.cache/turbo-llama/build/cpu/bin/llama-perplexity
P=/tmp/h16/llama-perplexity-sink
run() {  # out_dir name model base chunks ctk/ctv mode binary [extra args]
  local dir=$1 name=$2 m=$3 base=$4 ch=$5 t=$6 mode=$7 bin=$8; shift 8
  STUDY_SINK=$mode nice -n 10 $bin -m $m -f jargon.txt -c 2048 --chunks $ch -fa on -t 2 -ctk $t -ctv $t \
    --kl-divergence-base $base "$@" > $dir/$name.log 2>&1
  echo "$(date +%T) $name rc=$?" >> $dir/queue.done
}
Q=/work/exp/q.gguf; QB=/work/exp/q-f16-c1.kld
G=/work/exp/g.gguf; GB=/work/exp/g-f16-c4.kld
for t in turbo3 turbo2; do
  [ $t = turbo3 ] && run out q-$t-ship $Q $QB 1 $t 0 $SHIP --kl-divergence
  for mode in 0 K 1; do run out q-$t-sink$mode $Q $QB 1 $t $mode $P --kl-divergence; done
done
for t in turbo3 turbo2; do
  [ $t = turbo3 ] && run out g-$t-ship $G $GB 4 $t 0 $SHIP --kl-divergence
  for mode in 0 K 1; do run out g-$t-sink$mode $G $GB 4 $t $mode $P --kl-divergence; done
done
# Qwen turbo3 again over 2 chunks (one chunk's mean KLD is carried by a few tokens): its own f16 base, logs in out2/
run out2 q-f16-c2 $Q /tmp/h16/q-f16-c2.kld 2 f16 0 $SHIP
for mode in 0 1 K; do run out2 q2-turbo3-sink$mode $Q /tmp/h16/q-f16-c2.kld 2 turbo3 $mode $P --kl-divergence; done
