"""Shared fixtures: the real model, the evaluation texts, the built llama.cpp tools, the quick eval.

Kept to fixtures only (several people add tests here).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def missing(reason: str):
    """A missing model, text or tool skips a developer's run, but fails CI (CI=true): there,
    .ci/run installs and builds everything, so a missing piece is a defect, not a reason to skip."""
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The default real model (Gemma 3 270M Q4_K_M), assembled and sha256-checked in our cache."""
    from turbo_llama import model
    try:
        return model.default_model()
    except model.AssetError as e:
        missing(str(e))


@pytest.fixture(scope="session")
def jargon_path() -> Path:
    from turbo_llama import model
    try:
        return model.jargon_text()
    except model.AssetError as e:
        missing(str(e))


@pytest.fixture(scope="session")
def bible_path() -> Path:
    from turbo_llama import model
    try:
        return model.bible_text()
    except model.AssetError as e:
        missing(str(e))


@pytest.fixture(scope="session")
def llama_tool():
    """llama_tool("llama-bench") -> Path of the built tool, or skip when it is not built."""
    from turbo_llama.llama_tools import ToolError, find_tool

    def get(name: str) -> Path:
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
