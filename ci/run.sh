#!/usr/bin/env bash
# The CI job (called by .ci/run): the README's two commands, with the quick eval.
#   1. main job:  bash ci/setup.sh && .venv/bin/turbo-llama build && .venv/bin/turbo-llama eval (quick; --full)
#   2. tests:     .venv/bin/python -m pytest -q tests
# Exits with pytest's status. Caches (kept between runs when the CI keeps ~/.cache):
#   ~/.cache/pip, ~/.cache/ccache, ~/.cache/turbo-llama/downloads (the sha256-verified sdist).
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 ))s] $*"; }

stamp "setup"
bash ci/setup.sh || { echo "ci: setup failed" >&2; exit 1; }
export PATH="$PWD/.venv/bin:$PATH"

stamp "turbo-llama build"
turbo-llama build
build_rc=$?
[ $build_rc = 0 ] || echo "ci: turbo-llama build failed (exit $build_rc); the tests will show it" >&2

# --- the quick eval on the default model (Gemma 3 270M: the quality ladder, needles to 4K) and a short Qwen check
# --- (Qwen2.5 Coder 1.5B: one 2048-token chunk of the Jargon File and one of the stdlib code text, for f16, turbo3
# --- and turbo4 where the build has it; no needles).
# --- tests/test_eval_guard.py compares both with tests/data/eval_reference.json (and reruns them if missing).
eval_rc=skipped
qwen_rc=skipped
if [ $build_rc = 0 ]; then
    stamp "turbo-llama eval --quick --out results/ci"
    turbo-llama eval --quick --out results/ci
    eval_rc=$?
    qwen_types=$(python -c 'from turbo_llama.cache_types import qwen_check_types; print(qwen_check_types())')
    qwen_args=(--model qwen2.5-coder-1.5b --types "$qwen_types" --chunks 1 --no-niah --text jargon,code --out results/ci-qwen)
    stamp "turbo-llama eval ${qwen_args[*]}"
    turbo-llama eval "${qwen_args[@]}"
    qwen_rc=$?
else
    echo "ci: build failed: evals skipped"
fi

stamp "python -m pytest -q tests"
mkdir -p build
python -m pytest -q tests 2>&1 | tee build/ci-pytest.log
test_rc=${PIPESTATUS[0]}

stamp "done: build exit $build_rc, eval exit $eval_rc, qwen check exit $qwen_rc, pytest exit $test_rc"
echo "== pytest summary:"
grep -E "^(FAILED|ERROR) " build/ci-pytest.log | head -50 || true
tail -n 1 build/ci-pytest.log
exit $test_rc
