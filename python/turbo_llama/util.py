"""Small helpers every part of the toolkit uses (imports nothing of turbo_llama but errors)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from collections import deque
from pathlib import Path

from .errors import ToolkitError


def say(msg: str):
    """A progress line on stderr, "turbo-llama: <msg>"."""
    print(f"turbo-llama: {msg}", file=sys.stderr, flush=True)


def git(*args, cwd: Path | str | None = None, env: dict | None = None,
        check: bool = True) -> subprocess.CompletedProcess:
    """`git [-C cwd] args...`, output captured; check: a failure raises ToolkitError with git's words."""
    cmd = ["git", *(["-C", str(cwd)] if cwd is not None else []), *args]
    try:
        r = subprocess.run(cmd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except FileNotFoundError:
        raise ToolkitError("git is not installed (needed to verify and patch the source)")
    if check and r.returncode != 0:
        where = f" in {cwd}" if cwd is not None else ""
        raise ToolkitError(f"git {' '.join(args)} failed{where}:\n{(r.stderr or r.stdout).strip()}")
    return r


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tail(path: Path, n: int = 40) -> str:
    """The last n lines of a text file ("" when it cannot be read)."""
    try:
        with open(path, errors="replace") as f:
            return "".join(deque(f, maxlen=n))
    except OSError:
        return ""


def write_json_atomic(path: Path, data: dict):
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def rmtree(p: Path):
    """Remove a directory tree if it exists, read-only files included."""
    if p.exists() or p.is_symlink():
        def onerror(func, path, exc):  # make read-only files removable
            try:
                os.chmod(path, stat.S_IWUSR | stat.S_IRUSR | stat.S_IXUSR)
                func(path)
            except OSError:
                pass
        shutil.rmtree(p, onerror=onerror)


@contextlib.contextmanager
def sigterm_as_exit():
    """SIGTERM unwinds like Ctrl-C: ninja is stopped and waited for before the lock is released,
    so no orphaned compiler keeps writing into a build dir the next run uses."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise SystemExit(128 + signum)
    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
