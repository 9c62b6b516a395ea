#!/usr/bin/env bash
# turbo-llama: tests/test_kv_features.py (issue #7: slot save/restore, parallel slots, context shift,
# cache reuse, RPC, prompt-cache files) on a CUDA machine, against prebuilt binaries, to record them.
#   ci/gpu-kv.sh BIN_DIR MODEL JARGON OUTDIR
#     BIN_DIR  llama.cpp build/bin with llama-server, llama-completion, llama-perplexity, ggml-rpc-server
#              (built with -DGGML_CUDA=ON -DGGML_RPC=ON -DLLAMA_BUILD_SERVER=ON)
#     MODEL    Gemma 3 270M Q4_K_M GGUF;  JARGON  the jargon text (perplexity fallback of the RPC test)
#     OUTDIR   gets kv-features.log (the whole pytest output) and logs/ (each test's server and tool
#              logs; the slot and prompt-cache files stay in /tmp); one summary line goes to stdout
# Needs only python3 (>= 3.11): pytest and its dependencies come from .whl/ (pure-Python wheels, no
# index); no compiled bindings, no model package, no build (tests/conftest.py: environment overrides).
# Environment: TURBO_LLAMA_NGL (default 99), TURBO_LLAMA_KV_FILTER (a pytest -k expression),
#   TURBO_LLAMA_KV_TIMEOUT (seconds for the whole run, default 300; the servers are stopped with it),
#   TURBO_LLAMA_XFAIL_STRICT (default 0 here: an XPASS of a CPU-measured strict xfail is reported, not failed).
# Exit status: pytest's (124 when the time ran out).
set -u
[ $# = 4 ] || { echo "usage: $0 BIN_DIR MODEL JARGON OUTDIR" >&2; exit 2; }
REPO=$(cd "$(dirname "$0")/.." && pwd)
BIN_DIR=$(cd "$1" && pwd) || exit 2
MODEL=$(realpath "$2"); JARGON=$(realpath "$3"); OUTDIR=$4
mkdir -p "$OUTDIR"; OUTDIR=$(cd "$OUTDIR" && pwd)
LOG=$OUTDIR/kv-features.log
SITE=${TURBO_LLAMA_SITE:-/tmp/site}
cd "$REPO"

ls .whl/*.whl >/dev/null 2>&1 || { echo "gpu-kv: no wheels in .whl/ (carry .whl)"; exit 2; }
# (pure-Python wheels: where pip is missing, unpacking them is an install too)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    > "$OUTDIR/pip.log" 2>&1 \
    || python3 -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' \
        "$SITE" .whl/*.whl >> "$OUTDIR/pip.log" 2>&1 \
    || { echo "gpu-kv: wheel install failed"; cat "$OUTDIR/pip.log"; exit 2; }

export PYTHONPATH="$SITE:$REPO/python" PYTHONDONTWRITEBYTECODE=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
export TURBO_LLAMA_BIN_DIR=$BIN_DIR TURBO_LLAMA_MODEL=$MODEL TURBO_LLAMA_JARGON=$JARGON
export TURBO_LLAMA_NGL=${TURBO_LLAMA_NGL:-99} TURBO_LLAMA_XFAIL_STRICT=${TURBO_LLAMA_XFAIL_STRICT:-0}
export CI=true  # conftest: a missing tool, model or text fails instead of skipping
TMP=${TURBO_LLAMA_KV_TMP:-/tmp/tl/kv-tmp}  # pytest's tmp_path root (emptied by pytest at the start)
mkdir -p "$(dirname "$TMP")"

args=(-q -rA -p no:cacheprovider --basetemp "$TMP" --durations=10)
[ -n "${TURBO_LLAMA_KV_FILTER:-}" ] && args+=(-k "$TURBO_LLAMA_KV_FILTER")
t0=$(date +%s)
{
    echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
    echo "== BIN_DIR=$BIN_DIR MODEL=$MODEL JARGON=$JARGON NGL=$TURBO_LLAMA_NGL XFAIL_STRICT=$TURBO_LLAMA_XFAIL_STRICT"
    echo "== $(python3 --version) pytest ${args[*]} tests/test_kv_features.py"
} > "$LOG"
# timeout (not --foreground) signals its whole process group: pytest and the servers it started
timeout -k 15 "${TURBO_LLAMA_KV_TIMEOUT:-300}" python3 -m pytest "${args[@]}" tests/test_kv_features.py >> "$LOG" 2>&1
rc=$?
secs=$(( $(date +%s) - t0 ))
[ $rc = 124 ] && echo "== timed out after ${TURBO_LLAMA_KV_TIMEOUT:-300} s" >> "$LOG"
rm -rf "$OUTDIR/logs"; mkdir -p "$OUTDIR/logs"
(cd "$TMP" 2>/dev/null && find . -name '*.log' -size -20M -exec cp --parents {} "$OUTDIR/logs/" \;)
# pytest's last line: "N passed, M xfailed, K xpassed in T s" (or the reason it stopped)
summary=$(grep -E "^=*.*(passed|failed|error|skipped|xfailed|xpassed|no tests ran).* in [0-9.]+s" "$LOG" | tail -1 | tr -d '=' | sed 's/^ *//;s/ *$//')
echo "gpu-kv: rc=$rc ${secs}s | ${summary:-no pytest summary (see kv-features.log)} | $(grep -cE '^(FAILED|ERROR) ' "$LOG") FAILED/ERROR, $(grep -c '^XPASS' "$LOG") XPASS"
exit $rc
