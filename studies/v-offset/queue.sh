#!/bin/bash
# one run at a time: name model K V
cd /tmp/h14
O=~/.cache/turbo-llama/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
run() { ./llama-perplexity-v -m $2 -f jargon.txt -c 2048 --chunks 2 -fa on -t 2 -ctk $3 -ctv $4 --kl-divergence-base qwen-f16-c2.kld --kl-divergence > run-$1.log 2>&1; echo "$1 $(date +%T) $(grep -E 'Mean +PPL\(Q\)|Mean +KLD|Mean PPL\(Q\)/PPL\(base\)' run-$1.log | tr -s ' ' | tr '\n' ' ')" >> queue.done; }
run wmean-f16-f16 qwen-wmean.gguf f16 f16
run orig-f16-turbo2 $O f16 turbo2
run wmean-f16-turbo2 qwen-wmean.gguf f16 turbo2
run mean-f16-turbo2 qwen-mean.gguf f16 turbo2
run orig-turbo2-turbo2 $O turbo2 turbo2
run wmean-turbo2-turbo2 qwen-wmean.gguf turbo2 turbo2
run orig-f16-turbo3 $O f16 turbo3
run wmean-f16-turbo3 qwen-wmean.gguf f16 turbo3
run orig-turbo3-turbo3 $O turbo3 turbo3
run wmean-turbo3-turbo3 qwen-wmean.gguf turbo3 turbo3
run mean-turbo2-turbo2 qwen-mean.gguf turbo2 turbo2
echo ALLDONE >> queue.done
