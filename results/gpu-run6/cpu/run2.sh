#!/bin/bash
B=~/.cache/turbo-llama/build/cpu/bin
M=~/.cache/turbo-llama/models/gemma-3-270m-q4_k_m.gguf
T=/work/main/.devcarry/jargon.txt
for ub in 128; do
  s=$(date +%s)
  $B/llama-perplexity -m $M -f $T -c 2048 --chunks 32 -fa on -ctk turbo3 -ctv turbo3 -t 2 -ub $ub --kl-divergence-base /tmp/pplcpu/f16-logits.bin --kl-divergence > ppl-turbo3-ub$ub.log 2>&1
  echo "turbo3 ub$ub rc=$? $(( $(date +%s) - s ))s $(grep -E '^Mean PPL\(Q\)' ppl-turbo3-ub$ub.log) $(grep -E '^Mean +KLD' ppl-turbo3-ub$ub.log)" >> summary.txt
done
