#!/bin/bash
# f16, then each cache against it (KLD); 2 chunks of 2048 tokens. run.sh MODEL TAG; logs in $OUTDIR (/tmp/hd64-key-bias)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
P=$REPO/.venv/bin/llama-perplexity; T=${TURBO_LLAMA_CACHE:-$HOME/.cache/turbo-llama}/texts/jargon.txt; M=$(realpath "$1"); G=$2
mkdir -p "${OUTDIR:=/tmp/hd64-key-bias}" && cd "$OUTDIR" || exit 1
run() { # name env ctk ctv
  env $2 $P -m $M -f $T -c 2048 --chunks 2 -fa on -t 2 -ctk $3 -ctv $4 --kl-divergence-base $G-f16.kld --kl-divergence > $G-$1.log 2>&1
  echo "$G $1: $(grep -E 'Mean PPL\(Q\)/PPL\(base\)' $G-$1.log | tail -1 | tr -s ' ') | $(grep -E '^Mean +KLD' $G-$1.log | tr -s ' ')"
}
$P -m $M -f $T -c 2048 --chunks 2 -fa on -t 2 -ctk f16 -ctv f16 --kl-divergence-base $G-f16.kld > $G-f16.log 2>&1
echo "$G f16: $(grep -oE 'Final estimate.*' $G-f16.log)"
run turbo3 X=1 turbo3 turbo3
run turbo3-nooff TURBO_K_OFFSET=0 turbo3 turbo3
run turbo4 X=1 turbo4 turbo4
run q4_0 X=1 q4_0 q4_0
run q8_0 X=1 q8_0 q8_0
