#!/bin/bash
# the CPU against itself: the same run with weight repacking off (-nr) changes only the matmul arithmetic
B=/work/main/.venv/bin
M=~/.cache/turbo-llama/models/gemma-3-270m-q4_k_m.gguf
T=/work/main/.devcarry/jargon.txt
for t in ${TYPES:-turbo3 f16}; do
  s=$(date +%s)
  kl="--kl-divergence-base /tmp/pplcpu/f16-logits.bin --kl-divergence"
  $B/llama-perplexity -m $M -f $T -c 2048 --chunks 32 -fa on -ctk $t -ctv $t -t 2 -nr $kl > ppl-$t-nr.log 2>&1
  echo "$t -nr rc=$? $(( $(date +%s) - s ))s $(grep -E '^Mean PPL\(Q\) ' ppl-$t-nr.log) $(grep -E '^Mean +KLD' ppl-$t-nr.log)" >> summary.txt
done
