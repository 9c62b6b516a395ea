"""turbo-llama build: the real build of the patched tree (shared by all tests of the session)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _toolkit import mount_tmpfs, run_cli, umount
from turbo_llama.build import tools as B
from turbo_llama.build.installed import find_tool
from turbo_llama.build.source import load_pin
from turbo_llama.cachedir import cache_dir
from turbo_llama.errors import ToolkitError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def built():
    """One build per session (a no-op when `turbo-llama build` already ran, as in CI)."""
    return B.build(B.BuildOptions(jobs=2, progress=False))


def test_build_produces_self_contained_tools(built):
    for t in B.TARGETS:
        assert Path(built.binaries[t]).is_file()
        assert Path(built.installed[t]).is_file()
    ldd = subprocess.run(["ldd", built.binaries["llama-completion"]], text=True, stdout=subprocess.PIPE).stdout
    assert "not found" not in ldd and "libllama" not in ldd and "libggml" not in ldd


def test_version_reports_the_pin(built):
    pin = load_pin()
    r = subprocess.run([str(find_tool("llama-completion")), "--version"], text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    assert r.returncode == 0, r.stdout
    assert f"build {pin.build_number}" in r.stdout and f"commit {pin.short}" in r.stdout, r.stdout


def test_second_build_compiles_nothing(built):
    again = B.build(B.BuildOptions(jobs=2, progress=False))
    assert again.nothing_rebuilt and again.compiled_steps == 0
    assert "nothing rebuilt" in again.log.read_text().split("$ ")[0] or True
    log = again.log.read_text()
    assert not re.search(r"^\[\d+/\d+\] (Building|Linking)", log, re.M), log[-2000:]


def test_installed_json_and_find_tool(built):
    info = json.loads((cache_dir() / "installed.json").read_text())
    pin = load_pin()
    assert info["pin"] == pin.commit and info["cuda"] is False
    assert info["patches"] == built.prepared.patches
    assert set(B.TARGETS) <= set(info["binaries"])
    assert find_tool("llama-perplexity") == Path(info["installed"]["llama-perplexity"])
    with pytest.raises(ToolkitError, match="turbo-llama build"):
        find_tool("llama-no-such-tool")
    r = run_cli("info")
    assert r.returncode == 0 and pin.commit in r.stdout and "cuda:      no" in r.stdout


def test_cuda_without_nvcc_stops_at_once(monkeypatch):
    monkeypatch.setattr(B, "find_nvcc", lambda: None)
    t0 = time.time()
    with pytest.raises(ToolkitError, match="nvcc was not found"):
        B.build(B.BuildOptions(cuda=True))
    assert time.time() - t0 < 5


def test_killed_build_resumes(built):
    """SIGKILL the whole build halfway, run it again: it finishes and the result is consistent."""
    bdir = cache_dir() / "build" / "test-kill"   # same depth as build/cpu: ccache hits
    import shutil
    shutil.rmtree(bdir, ignore_errors=True)
    args = [sys.executable, "-m", "turbo_llama", "build", "--build-dir", str(bdir), "--target",
            "test-quantize-fns", "--no-install", "-j2"]
    p = subprocess.Popen(args, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = bdir / "turbo-build.log"
    killed = False
    deadline = time.time() + 600
    while time.time() < deadline and p.poll() is None:
        if log.is_file() and len(re.findall(r"^\[\d+/\d+\] Building", log.read_text(errors="replace"), re.M)) >= 3:
            os.killpg(p.pid, signal.SIGKILL)
            killed = True
            break
        time.sleep(0.05)
    p.wait()
    assert killed, "the build finished before it could be killed"
    assert not (bdir / "turbo-build.json").exists()
    r = subprocess.run(args, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    exe = bdir / "bin" / "test-quantize-fns"
    assert exe.is_file() and os.access(exe, os.X_OK)
    assert (bdir / "turbo-build.json").is_file()
    r = subprocess.run(args, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
    assert r.returncode == 0 and "nothing rebuilt" in r.stderr
    shutil.rmtree(bdir, ignore_errors=True)


def test_disk_full_during_build_is_a_clear_error(built, tmp_path):
    mnt = tmp_path / "small"
    mount_tmpfs(mnt, "size=6m")
    try:
        r = run_cli("build", "--build-dir", mnt / "build", "--target", "test-quantize-fns",
                    "--no-install", "-j2", timeout=1800)
        assert r.returncode == 1
        assert "no space left" in r.stderr.lower(), r.stderr[-3000:]
        assert "Traceback" not in r.stderr
        assert not (mnt / "build" / "turbo-build.json").exists()
    finally:
        umount(mnt)
    # the real build is unharmed
    assert find_tool("llama-completion").is_file()


def test_sync_tree_touches_only_changed_files(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "d").mkdir(parents=True)
    for n in ("x", "y", "d/z"):
        (a / n).write_text(n)
    assert B.sync_tree(a, b) == 3
    old = {n: (b / n).stat().st_mtime_ns for n in ("x", "y", "d/z")}
    time.sleep(0.02)
    (a / "y").write_text("changed")
    (a / "d" / "z").unlink()
    (a / "w").write_text("new")
    assert B.sync_tree(a, b) == 3
    assert (b / "x").stat().st_mtime_ns == old["x"]
    assert (b / "y").read_text() == "changed" and (b / "y").stat().st_mtime_ns > old["y"]
    assert not (b / "d" / "z").exists() and (b / "w").read_text() == "new"
    assert B.sync_tree(a, b) == 0


def _procs_mentioning(text: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if text in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def test_sigterm_stops_ninja_too(built):
    """SIGTERM to turbo-llama alone (not its group): ninja and the compilers stop with it."""
    import shutil
    bdir = cache_dir() / "build" / "test-term"
    shutil.rmtree(bdir, ignore_errors=True)
    args = [sys.executable, "-m", "turbo_llama", "build", "--build-dir", str(bdir), "--target",
            "test-quantize-fns", "--no-install", "-j2"]
    p = subprocess.Popen(args, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = bdir / "turbo-build.log"
    deadline = time.time() + 600
    while time.time() < deadline and p.poll() is None:
        if log.is_file() and len(re.findall(r"^\[\d+/\d+\] Building", log.read_text(errors="replace"), re.M)) >= 3:
            p.send_signal(signal.SIGTERM)
            break
        time.sleep(0.05)
    try:
        rc = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert rc != 0
    time.sleep(0.5)
    assert _procs_mentioning(str(bdir)) == []
    r = subprocess.run(args, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    shutil.rmtree(bdir, ignore_errors=True)
