"""The cache directory (downloads, unpacked upstream, prepared trees, builds) and its lock.

Location: $TURBO_LLAMA_CACHE, else ~/.cache/turbo-llama.  Layout:

    downloads/                 verified sdists (kept between runs; safe to cache in CI)
    upstream/<commit>/         the pristine upstream tree, unpacked and tree-hash verified
    prepared/<key>/            prepared trees (git repo: pristine, overlay, patches), keyed by inputs
    src/llama.cpp/             the tree builds compile: a copy of the current prepared tree that
                               only rewrites files whose content changed (so ninja rebuilds little)
    build/<variant>/           cmake/ninja build dirs (cpu, cuda-90, ...)
    installed.json             what the last build produced and installed
    lock                       flock()ed around prepare and build
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sys
import tempfile
from pathlib import Path

from .errors import ToolkitError

ENV = "TURBO_LLAMA_CACHE"


def cache_dir(create: bool = True) -> Path:
    """The cache root; created (and checked writable) unless create=False."""
    env = os.environ.get(ENV)
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "turbo-llama"
    root = root.absolute()
    if create:
        ensure_writable(root)
    return root


def ensure_writable(path: Path) -> None:
    """mkdir -p and prove we can write there (root ignores permission bits, so really write)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".write-test-", dir=path)
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise ToolkitError(f"no space left on the device holding the cache {path}. "
                               f"Free some space or set {ENV} to a directory on another disk.")
        raise ToolkitError(f"the cache directory {path} is not writable ({e.strerror}). "
                           f"Set {ENV} to a writable directory, e.g. {ENV}=/tmp/turbo-llama-cache")


@contextlib.contextmanager
def locked(root: Path | None = None, what: str = "prepare/build"):
    """Exclusive lock on <cache>/lock. A second process waits, and says so."""
    root = root or cache_dir()
    path = root / "lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ToolkitError(f"cannot create the lock file {path} ({e.strerror}). "
                           f"Set {ENV} to a writable directory.")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            except OSError:
                holder = "?"
            print(f"turbo-llama: another turbo-llama (pid {holder or '?'}) holds the lock on {root}; "
                  f"waiting for it to finish...", file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
            print("turbo-llama: lock acquired, continuing", file=sys.stderr, flush=True)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def disk_full_error(e: BaseException, where: Path | str) -> ToolkitError | None:
    """A ToolkitError for ENOSPC (or None if e is something else)."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return ToolkitError(f"no space left on the device while writing {where}. Incomplete "
                            f"outputs are never marked done (they are redone next time); free "
                            f"some space (or set {ENV} / --build-dir elsewhere) and run the "
                            f"command again.")
    return None
