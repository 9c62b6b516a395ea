#!/bin/bash
# the table of results/k-transforms.md "End to end (study binary)" from the llama-perplexity logs in $1 (default out/)
D=${1:-$(dirname "$0")/out}
echo "| run | PPL(Q)/PPL(base) | mean KLD | same top p |"
echo "|---|---|---|---|"
for f in "$D"/*.log; do
  n=$(basename "$f" .log)
  r=$(grep 'Mean PPL(Q)/PPL(base)' "$f" | awk -F: '{print $2}' | xargs)
  k=$(grep 'Mean    KLD' "$f" | awk -F: '{print $2}' | xargs)
  t=$(grep 'Same top p' "$f" | awk -F: '{print $2}' | xargs)
  echo "| $n | $r | $k | $t |"
done
