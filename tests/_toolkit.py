"""Shared helpers of the toolkit tests (test_pin, test_prepare, test_build)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from turbo_llama.build.source import get_source, load_pin
from turbo_llama.cachedir import cache_dir, locked


def pristine_path() -> Path:
    """The verified pristine upstream tree in the default cache (downloaded once)."""
    root = cache_dir()
    with locked(root):
        return get_source(None, load_pin(), root).path


def sdist_path() -> Path:
    pristine_path()
    return cache_dir() / "downloads" / load_pin().sdist_filename


def seed_cache(dst: Path) -> Path:
    """A fresh cache dir holding (a hard link to) the verified sdist, so nothing is downloaded."""
    dl = dst / "downloads"
    dl.mkdir(parents=True, exist_ok=True)
    src = sdist_path()
    try:
        os.link(src, dl / src.name)
    except OSError:
        shutil.copy2(src, dl / src.name)
    return dst


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def run_cli(*args, env=None, cwd=None, timeout=1800, **kw) -> subprocess.CompletedProcess:
    e = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "turbo_llama", *map(str, args)], env=e, cwd=cwd,
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, **kw)


def mount_tmpfs(path: Path, *opts: str) -> None:
    """mount a tmpfs (root only); skip the test where the container does not allow it."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(opts) or "size=1m", "tmpfs", str(path)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stdout.strip()}")


def umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def git(cwd: Path, *args) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for k in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(k, None)
    r = subprocess.run(["git", "-C", str(cwd), *args], env=env, text=True, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    assert r.returncode == 0, f"git {args}: {r.stderr}"
    return r.stdout
