#!/bin/bash
# STUDY (helper-16): Qwen turbo3 again over 2 chunks (1 chunk's mean KLD is carried by a few tokens)
cd /tmp/h16
while kill -0 $(cat /tmp/h16/queue.pid) 2>/dev/null; do sleep 5; done
SHIP=/root/.cache/turbo-llama/build/cpu/bin/llama-perplexity
P=/tmp/h16/llama-perplexity-sink
Q=/work/exp/q.gguf
nice -n 10 $SHIP -m $Q -f jargon.txt -c 2048 --chunks 2 -fa on -t 2 -ctk f16 -ctv f16 --kl-divergence-base /tmp/h16/q-f16-c2.kld > out2/q-f16-c2.log 2>&1
echo "$(date +%T) q-f16-c2 rc=$?" >> out2/queue.done
for mode in 0 1 K; do
  STUDY_SINK=$mode nice -n 10 $P -m $Q -f jargon.txt -c 2048 --chunks 2 -fa on -t 2 -ctk turbo3 -ctv turbo3 \
    --kl-divergence-base /tmp/h16/q-f16-c2.kld --kl-divergence > out2/q2-turbo3-sink$mode.log 2>&1
  echo "$(date +%T) q2-turbo3-sink$mode rc=$?" >> out2/queue.done
done
