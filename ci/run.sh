#!/usr/bin/env bash
# The CI job (called by .ci/run): the README's two commands, with the quick eval.
#   1. main job:  bash ci/setup.sh && .venv/bin/turbo-llama build && .venv/bin/turbo-llama eval [--quick]
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

# --- quick eval (the eval helper's command). Guarded so CI does not break while it is being written;
# --- the tests (conftest eval_results) rerun it when results/ci/results.json is missing.
eval_rc=skipped
if [ $build_rc = 0 ] && turbo-llama eval --help >/dev/null 2>&1; then
    stamp "turbo-llama eval --quick --out results/ci"
    turbo-llama eval --quick --out results/ci
    eval_rc=$?
else
    echo "ci: turbo-llama eval not available yet (or build failed): skipped"
fi

stamp "python -m pytest -q tests"
mkdir -p build
python -m pytest -q tests 2>&1 | tee build/ci-pytest.log
test_rc=${PIPESTATUS[0]}

stamp "done: build exit $build_rc, eval exit $eval_rc, pytest exit $test_rc"
echo "== pytest summary:"
grep -E "^(FAILED|ERROR) " build/ci-pytest.log | head -50 || true
tail -n 1 build/ci-pytest.log
exit $test_rc
