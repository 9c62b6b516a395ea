"""What the last `turbo-llama build` installed (<cache>/installed.json), and finding a built tool.

find_tool() is the one locator of the llama.cpp binaries for every command and test:
$TURBO_LLAMA_BIN_DIR (an explicit override), then installed.json, then PATH.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from ..cachedir import cache_dir
from ..errors import ToolNotFound

INSTALLED = "installed.json"
BIN_DIR_ENV = "TURBO_LLAMA_BIN_DIR"


def default_bin_dir(prefix: Path | str | None = None) -> Path:
    """Where binaries are installed: --prefix/bin, else the active venv's bin, else ~/.local/bin."""
    if prefix:
        return Path(prefix).expanduser().absolute() / "bin"
    if sys.prefix != sys.base_prefix or os.environ.get("VIRTUAL_ENV"):
        return Path(sys.prefix) / "bin"
    return Path.home() / ".local" / "bin"


def installed_info() -> dict | None:
    try:
        return json.loads((cache_dir(create=False) / INSTALLED).read_text())
    except (OSError, ValueError):
        return None


def find_tool(name: str) -> Path:
    """Path of a built llama.cpp tool (llama-perplexity, llama-server, llama-bench, ...).

    $TURBO_LLAMA_BIN_DIR > installed.json (installed copy, then the build dir's) > PATH; else ToolNotFound
    (both a ToolError and a ToolkitError)."""
    d = os.environ.get(BIN_DIR_ENV)
    if d and (Path(d) / name).is_file():
        return Path(d) / name
    info = installed_info()
    if info:
        for key in ("installed", "binaries"):
            p = info.get(key, {}).get(name)
            if p and Path(p).is_file() and os.access(p, os.X_OK):
                return Path(p)
    exe = shutil.which(name)
    if exe:
        return Path(exe)
    raise ToolNotFound(f"{name} not found: it is built by `turbo-llama build` (no build recorded in "
                       f"{cache_dir(create=False) / INSTALLED}, and {name} is not on PATH). "
                       f"Run `turbo-llama build` first (or set {BIN_DIR_ENV} to a llama.cpp build/bin).")
