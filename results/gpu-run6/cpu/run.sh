#!/bin/bash
# CPU side of the CPU/GPU perplexity agreement on more text: jargon.txt, 32 chunks of 2048
B=~/.cache/turbo-llama/build/cpu/bin
M=~/.cache/turbo-llama/models/gemma-3-270m-q4_k_m.gguf
T=/work/main/.devcarry/jargon.txt
for t in f16 turbo3 turbo2 q4_0; do
  kl="--kl-divergence-base /tmp/pplcpu/f16-logits.bin"; [ "$t" != f16 ] && kl="$kl --kl-divergence"
  s=$(date +%s)
  $B/llama-perplexity -m $M -f $T -c 2048 --chunks 32 -fa on -ctk $t -ctv $t -t 2 $kl > ppl-$t.log 2>&1
  echo "$t rc=$? $(( $(date +%s) - s ))s $(grep -E 'Final estimate' ppl-$t.log) $(grep -E '^Mean +KLD' ppl-$t.log)" >> summary.txt
done
