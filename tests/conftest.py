"""Shared fixtures: the real model, the evaluation texts, the built llama.cpp tools, the quick eval.

Kept to fixtures only (several people add tests here).

Environment overrides (all unset in CI, which then behaves exactly as without them). They let
tests/test_kv_features.py run on another machine (a CUDA box, see ci/gpu-kv.sh) against prebuilt
binaries, without the compiled bindings, the model package or a build:
  TURBO_LLAMA_BIN_DIR   llama.cpp tools are taken from this dir only (llama-server, llama-completion,
                        llama-perplexity, ggml-rpc-server, ...; ggml-rpc-server may also be named
                        rpc-server); nothing is built or searched elsewhere. When it is set and the
                        package cannot be imported (no compiled extension), `turbo_llama` is made a bare
                        package over python/turbo_llama, so its pure-Python modules (eval/llama_tools.py, ...) import.
  TURBO_LLAMA_MODEL     the GGUF model file (default: the Gemma 3 270M Q4_K_M from the model package)
  TURBO_LLAMA_JARGON    the perplexity text (default: the Jargon File shipped with the package, unpacked into our cache)
  TURBO_LLAMA_BIBLE     the NIAH haystack text (default: the King James Bible shipped with the package)
  TURBO_LLAMA_NGL       read by tests/_kv_helpers.py: unset or 0 = CPU, the tools get the CPU arguments
                        as always (-t 2, -nr where a test needs it); N > 0 = GPU: every tool also gets
                        `-ngl N`, the RPC client is pinned to the RPC device (-dev RPC0), and -nr (CPU
                        weight repacking) is left out
  TURBO_LLAMA_XFAIL_STRICT  1 (default on CPU) keeps the strict xfails strict; 0 (default when
                        TURBO_LLAMA_NGL > 0) turns them into plain xfails, so an XPASS is reported, not a
                        failure: their measurements are CPU ones, a GPU run records them, it is not gated
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN_DIR = os.environ.get("TURBO_LLAMA_BIN_DIR")
GPU = int(os.environ.get("TURBO_LLAMA_NGL") or 0) > 0
XFAIL_STRICT = os.environ.get("TURBO_LLAMA_XFAIL_STRICT", "0" if GPU else "1") != "0"
TOOL_ALIASES = {"ggml-rpc-server": ["rpc-server"]}  # older llama.cpp trees name it rpc-server


def _bare_package_without_bindings() -> None:
    """With TURBO_LLAMA_BIN_DIR on a bare checkout the package's __init__ cannot import the compiled
    extension: register python/turbo_llama as a package without running __init__ (tests that need the
    bindings then fail on their own import, which is right: they are not meant to run there)."""
    try:
        import turbo_llama  # noqa: F401
    except ImportError:
        import types
        pkg = types.ModuleType("turbo_llama")
        pkg.__path__ = [str(REPO / "python" / "turbo_llama")]
        pkg.__file__ = None
        sys.modules["turbo_llama"] = pkg


if BIN_DIR:
    _bare_package_without_bindings()


def pytest_collection_modifyitems(config, items):
    if XFAIL_STRICT:
        return
    for item in items:
        for mark in list(item.iter_markers(name="xfail")):
            if mark.kwargs.get("strict"):
                # the first xfail mark is the one evaluated: put a non-strict copy in front
                kwargs = {**mark.kwargs, "strict": False,
                          "reason": "[not strict: TURBO_LLAMA_XFAIL_STRICT=0] " + mark.kwargs.get("reason", "")}
                item.add_marker(pytest.mark.xfail(*mark.args, **kwargs), append=False)
                break


def missing(reason: str):
    """A missing model, text or tool skips a developer's run, but fails CI (CI=true): there,
    .ci/run installs and builds everything, so a missing piece is a defect, not a reason to skip."""
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def _given(env: str) -> Path:
    p = Path(os.environ[env]).expanduser()
    if not p.is_file():
        missing(f"{env}={p}: no such file")
    return p


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The default real model (Gemma 3 270M Q4_K_M), assembled and sha256-checked in our cache."""
    if os.environ.get("TURBO_LLAMA_MODEL"):
        return _given("TURBO_LLAMA_MODEL")
    from turbo_llama.eval import model
    try:
        return model.default_model()
    except model.AssetError as e:
        missing(str(e))


@pytest.fixture(scope="session")
def jargon_path() -> Path:
    if os.environ.get("TURBO_LLAMA_JARGON"):
        return _given("TURBO_LLAMA_JARGON")
    from turbo_llama.eval import model
    try:
        return model.jargon_text()
    except model.AssetError as e:
        missing(str(e))


@pytest.fixture(scope="session")
def bible_path() -> Path:
    if os.environ.get("TURBO_LLAMA_BIBLE"):
        return _given("TURBO_LLAMA_BIBLE")
    from turbo_llama.eval import model
    try:
        return model.bible_text()
    except model.AssetError as e:
        missing(str(e))


@pytest.fixture(scope="session")
def llama_tool():
    """llama_tool("llama-bench") -> Path of the built tool, or skip when it is not built."""
    from turbo_llama.build.installed import find_tool
    from turbo_llama.errors import ToolError

    def get(name: str) -> Path:
        if BIN_DIR:
            for n in [name, *TOOL_ALIASES.get(name, [])]:
                if (Path(BIN_DIR) / n).is_file():
                    return Path(BIN_DIR) / n
            missing(f"{name} not found in TURBO_LLAMA_BIN_DIR={BIN_DIR}")
        try:
            return find_tool(name)
        except ToolError as e:
            missing(str(e))
    return get


@pytest.fixture(scope="session")
def eval_results(model_path, jargon_path, bible_path, llama_tool) -> dict:
    """results.json of the quick eval: $TURBO_LLAMA_EVAL_DIR (default results/ci), produced by
    .ci/run via `turbo-llama eval --quick --out results/ci`; run here if it is missing."""
    import json
    d = Path(os.environ.get("TURBO_LLAMA_EVAL_DIR", REPO / "results" / "ci"))
    f = d / "results.json"
    done = f.exists() and json.loads(f.read_text()).get("status") == "done"
    if not done:
        llama_tool("llama-perplexity")
        llama_tool("llama-server")
        subprocess.run([sys.executable, "-m", "turbo_llama", "eval", "--quick", "--out", str(d)],
                       check=True, cwd=REPO)
    return json.loads(f.read_text())


# ci/run.sh's Qwen step (+ --types): two texts, the guard reads both
QWEN_CHECK = ["--model", "qwen2.5-coder-1.5b", "--chunks", "1", "--no-niah", "--text", "jargon,code"]


@pytest.fixture(scope="session")
def qwen_results(llama_tool) -> dict:
    """results.json of CI's short Qwen check: $TURBO_LLAMA_QWEN_EVAL_DIR (default results/ci-qwen), produced by
    ci/run.sh; run here (the same command) if it is missing."""
    import json
    d = Path(os.environ.get("TURBO_LLAMA_QWEN_EVAL_DIR", REPO / "results" / "ci-qwen"))
    f = d / "results.json"
    done = f.exists() and json.loads(f.read_text()).get("status") == "done"
    if not done:
        from turbo_llama.cache_types import qwen_check_types
        exe = llama_tool("llama-perplexity")
        subprocess.run([sys.executable, "-m", "turbo_llama", "eval", *QWEN_CHECK, "--types", qwen_check_types(exe),
                        "--out", str(d)], check=True, cwd=REPO)
    return json.loads(f.read_text())
