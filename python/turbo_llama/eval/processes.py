"""Child processes that end with us, and SIGTERM/SIGINT as a clean stop.

Every llama.cpp tool that eval and bench start runs in a process group of its own (start_new_session),
is registered here while it runs, and is stopped as a group (SIGTERM, then SIGKILL) when its step ends,
fails or is interrupted; `stop_all()` is the last word for anything still registered. A Ctrl-C in a
terminal therefore reaches only us, and we stop the tools ourselves, in order, after writing what finished.

`interruptible()` turns SIGTERM (and SIGHUP) into `Interrupted`, a KeyboardInterrupt, so one code path
(try/finally) handles Ctrl-C, `kill` and a closed terminal alike; later signals during the cleanup
are ignored so the partial results get written.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading

_children: set[subprocess.Popen] = set()
_lock = threading.Lock()


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP: stop, keep what finished."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def popen(cmd: list[str], **kw) -> subprocess.Popen:
    """subprocess.Popen in its own process group, registered until stop()."""
    p = subprocess.Popen(cmd, start_new_session=True, **kw)
    with _lock:
        _children.add(p)
    return p


def stop(p: subprocess.Popen, timeout: float = 15) -> None:
    """End p and everything it started (its process group): SIGTERM, then SIGKILL after timeout s."""
    if p.poll() is None:
        _signal_group(p, signal.SIGTERM)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    # the group may outlive its leader (a grandchild): make sure it is gone
    _signal_group(p, signal.SIGKILL)
    p.wait(timeout=timeout)
    with _lock:   # only now: a stop cut short (a signal) leaves p registered, for stop_all()
        _children.discard(p)


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, sig)


def run(cmd: list[str], timeout: float | None = None, **kw) -> int:
    """Run cmd to its end (like subprocess.run, output wherever kw sends it); always stopped on the way out."""
    p = popen(cmd, **kw)
    try:
        return p.wait(timeout=timeout)
    finally:
        stop(p)


def stop_all() -> None:
    with _lock:
        left = list(_children)
    for p in left:
        stop(p, timeout=5)


def running() -> list[int]:
    with _lock:
        return [p.pid for p in _children if p.poll() is None]


@contextlib.contextmanager
def interruptible():
    """Within: SIGTERM/SIGHUP/SIGINT raise Interrupted (once); on the way out every child is stopped."""
    if threading.current_thread() is not threading.main_thread():  # signals only reach the main thread
        try:
            yield
        finally:
            stop_all()
        return
    fired = []

    def handler(signum, frame):
        if fired:       # already stopping: let the cleanup finish
            return
        fired.append(signum)
        raise Interrupted(signum)

    sigs = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
    old = {s: signal.getsignal(s) for s in sigs}
    for s in sigs:
        signal.signal(s, handler)
    try:
        yield
    finally:
        try:
            stop_all()
        finally:
            for s, h in old.items():
                signal.signal(s, h)


def exit_code(e: KeyboardInterrupt) -> int:
    """The shell's convention: 128 + the signal's number (Ctrl-C: 130, SIGTERM: 143)."""
    return 128 + (e.signum if isinstance(e, Interrupted) else signal.SIGINT)


def run_capture(cmd: list[str], env: dict | None = None, timeout: float | None = None) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True) in its own process group, stopped on the way out."""
    p = popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
              errors="replace", env=env)
    try:
        out, err = p.communicate(timeout=timeout)
    finally:
        stop(p)
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)
