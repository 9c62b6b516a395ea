#!/bin/bash
# helper-B, branch shortctx (issue #29): the tensor-core decode's one-block form at short contexts (D = 128, up to
# 257 keys: no merge launch). Runs on the H200 with binaries built elsewhere (bin/ unpacked to $B, LD_LIBRARY_PATH
# set by the caller): the turbo FLASH_ATTN_EXT and ROPE_FLASH_ATTN cases (patch 0057 adds the short-cache ones), then
# tg128 at depth 0, f16 against turbo3. Everything into $OUT/summary.txt (plus the raw logs). ~150 s.
set -u
B=${B:-/tmp/tl/build/bin}
OUT=${OUT:-/tmp/hB-out}
mkdir -p "$OUT"
S=$OUT/summary.txt
: > "$S"
say() { echo "$*" | tee -a "$S"; }

say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null)"
say "bin: $B"

# a test log's verdict: the counts, the failures (first 40), the last lines
summ() {
    local name=$1 raw=$2 rc=$3
    local log=${raw%.log}.txt
    sed 's/\x1b\[[0-9;]*m//g' "$raw" > "$log"   # (test-backend-ops colours OK / FAIL)
    say "== $name rc=$rc  OK: $(grep -v Backend "$log" | grep -c 'OK$')  FAIL: $(grep -v Backend "$log" | grep -c 'FAIL$')  not supported: $(grep -c 'not supported' "$log")"
    grep -v Backend "$log" | grep 'FAIL$' | head -40 | tee -a "$S" >/dev/null
    grep -E 'tests passed|Backend CUDA0' "$log" | tail -3 | tee -a "$S" >/dev/null
    # the short-cache cell-0 cases (patch 0057: n_used / sinks / max_bias in the name) on their own
    say "   of them with 0057's cell-0 parameters (n_used=): OK $(grep 'n_used=' "$log" | grep -c 'OK$')  FAIL $(grep 'n_used=' "$log" | grep -c 'FAIL$')"
}

t0=$(date +%s)
timeout 150 "$B/test-backend-ops" -b CUDA0 -o FLASH_ATTN_EXT -p turbo > "$OUT/fa.log" 2>&1
summ FLASH_ATTN_EXT "$OUT/fa.log" $?
say "   ($(( $(date +%s) - t0 )) s)"

t0=$(date +%s)
timeout 60 "$B/test-backend-ops" -b CUDA0 -o ROPE_FLASH_ATTN -p turbo > "$OUT/rope.log" 2>&1
summ ROPE_FLASH_ATTN "$OUT/rope.log" $?
say "   ($(( $(date +%s) - t0 )) s)"

while pgrep -f shape_gguf > /dev/null; do sleep 1; done   # (the wrapper writes the GGUF while the tests run)
if [ -z "${M8:-}" ] || [ ! -f "$M8" ]; then
    M8=$(PYTHONPATH=python:/tmp/tl/tree/gguf-py python3 -c "from pathlib import Path; from turbo_llama.shapes import shape_gguf; print(shape_gguf('llama8b', Path('/tmp/tlcache/shapes')))" 2>>"$OUT/bench.log" | tail -1)
fi
say "model: ${M8:-none}"
t0=$(date +%s)
timeout 200 "$B/llama-bench" -m "$M8" -fa 1 -ngl 99 -p 0 -n 128 -r 2 -ctk f16,turbo3 -ctv f16,turbo3 > "$OUT/bench.md" 2>>"$OUT/bench.log"
say "== llama-bench rc=$? ($(( $(date +%s) - t0 )) s)"
cat "$OUT/bench.md" >> "$S"
# the ratio that matters: turbo3/turbo3 against f16/f16 (tg128, depth 0)
python3 - "$OUT/bench.md" <<'EOF' | tee -a "$S"
import re, sys
ts = {}
for line in open(sys.argv[1]):
    c = [x.strip() for x in line.split('|')]
    if len(c) < 8 or 'tg128' not in line:
        continue
    kv = tuple(x for x in c if x in ('f16', 'turbo3'))
    m = re.search(r'([0-9.]+) ± ([0-9.]+)', line)
    if m and len(kv) >= 2:
        ts[kv[-2:]] = float(m.group(1))
f, t = ts.get(('f16', 'f16')), ts.get(('turbo3', 'turbo3'))
print('tg128 t/s:', ts)
if f and t:
    print(f'turbo3/f16 at depth 0: {t/f:.3f}x (issue #29 target >= 0.97; run 37 before this: 0.948)')
EOF
tail -5 "$OUT/bench.log" >> "$S"
say "== done $(date -u +%FT%TZ)"
