"""prepare / patches check: all or nothing, names the failing patch and file, idempotent, locked."""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from _toolkit import copy_tree, git, mount_tmpfs, pristine_path, run_cli, seed_cache, umount
from turbo_llama.errors import ToolkitError
from turbo_llama.build.prepare import (PatchError, build_tree, check_patches, inputs_key, prepare,
                                 write_tarball)
from turbo_llama.build.source import (Source, data_root, load_pin, overlay_entries, series_patches,
                                tree_hash)


@pytest.fixture(scope="module")
def prepared():
    return prepare(quiet=True)


def test_patches_check_passes_on_the_pin():
    r = run_cli("patches", "check")
    assert r.returncode == 0, r.stdout + r.stderr
    for p in series_patches():
        assert re.search(rf"ok\s+{re.escape(p.name)}", r.stdout)
    assert "all patches apply cleanly" in r.stdout


def test_prepared_tree_layout(prepared):
    pin = load_pin()
    t = prepared.path
    assert git(t, "rev-parse", "pristine^{tree}").strip() == pin.tree
    log = git(t, "log", "--format=%s", "overlay..HEAD").splitlines()
    assert len(log) == len(series_patches())
    assert not git(t, "status", "--porcelain").strip(), "prepared tree must be clean"
    for src, dst in overlay_entries():
        if src.is_file():
            assert (t / dst).read_bytes() == src.read_bytes()


def test_prepare_is_idempotent_and_deterministic(prepared, tmp_path):
    again = prepare(quiet=True)
    assert again.reused and again.path == prepared.path and again.key == prepared.key
    # two fresh builds of the same inputs: same files, even the same commits
    pin = load_pin()
    src = Source(pristine_path(), "sdist", "")
    build_tree(src, tmp_path / "a", pin, series_patches(pin), overlay_entries(pin))
    assert tree_hash(tmp_path / "a") == tree_hash(prepared.path)
    assert git(tmp_path / "a", "rev-parse", "HEAD") == git(prepared.path, "rev-parse", "HEAD")


def test_key_changes_with_any_input(tmp_path):
    pin = load_pin()
    patches, overlay = series_patches(pin), overlay_entries(pin)
    k = inputs_key(pin, patches, overlay)
    extra = tmp_path / "0099-x.patch"
    extra.write_text("x")
    assert inputs_key(pin, patches + [extra], overlay) != k
    f = tmp_path / "f.c"
    f.write_text("int a;")
    assert inputs_key(pin, patches, overlay + [(f, "ggml/src/f.c")]) != k


# ---------------------------------------------------------------- failing patches

def _first_context_line(patch: Path) -> tuple[str, int]:
    """(file, 1-based line number) of the first context line of the first hunk of `patch`."""
    f, line_no = None, None
    lines = patch.read_text(errors="replace").splitlines()
    for i, l in enumerate(lines):
        if l.startswith("+++ b/"):
            f = l[6:]
        m = re.match(r"@@ -(\d+)(?:,\d+)? \+", l)
        if m and f:
            n = int(m.group(1))
            for l2 in lines[i + 1:]:
                if l2.startswith(" "):
                    return f, n
                if l2.startswith("-"):
                    n += 1
                elif l2.startswith("+"):
                    continue
                else:
                    break
    raise AssertionError(f"no context line in {patch}")


def _synthetic(tmp_path):
    """A tiny upstream tree and a format-patch made on a branch of it."""
    up = tmp_path / "up"
    up.mkdir()
    (up / "a.c").write_text("".join(f"int a{i};\n" for i in range(20)))
    (up / "b.c").write_text("int b;\n")
    work = copy_tree(up, tmp_path / "work")
    git(work, "init", "-q")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "pristine")
    txt = (work / "a.c").read_text().replace("int a10;\n", "int a10;\nint turbo;\n")
    (work / "a.c").write_text(txt)
    git(work, "commit", "-q", "-am", "add turbo")
    (work / "b.c").write_text("int b;\nint b2;\n")
    git(work, "commit", "-q", "-am", "b2")
    pdir = tmp_path / "patches"
    git(work, "format-patch", "-q", "-o", str(pdir), "HEAD~2..")
    return up, sorted(pdir.glob("*.patch"))


def test_synthetic_series_applies(tmp_path):
    up, patches = _synthetic(tmp_path)
    pin = dataclasses.replace(load_pin(), tree=tree_hash(up))
    build_tree(Source(up, "llama-src", ""), tmp_path / "out", pin, patches, [])
    assert "int turbo;" in (tmp_path / "out" / "a.c").read_text()
    assert "int b2;" in (tmp_path / "out" / "b.c").read_text()


def test_synthetic_changed_context_fails_naming_patch_and_file(tmp_path):
    up, patches = _synthetic(tmp_path)
    (up / "a.c").write_text((up / "a.c").read_text().replace("int a9;", "int a9_changed;"))
    before = tree_hash(up)
    pin = dataclasses.replace(load_pin(), tree=before)
    with pytest.raises(PatchError) as ei:
        build_tree(Source(up, "llama-src", ""), tmp_path / "out", pin, patches, [])
    assert ei.value.patch.name == patches[0].name and ei.value.files == ["a.c"]
    assert patches[0].name in str(ei.value) and "a.c" in str(ei.value)
    assert tree_hash(up) == before  # the source is never touched


def test_real_series_fails_cleanly_on_changed_context(tmp_path):
    patches = series_patches()
    if not patches:
        pytest.skip("the series is empty")
    f, n = _first_context_line(patches[0])
    tree = copy_tree(pristine_path(), tmp_path / "llama.cpp")
    lines = (tree / f).read_text().split("\n")
    lines[n - 1] = lines[n - 1] + " /* changed by the test */"
    (tree / f).write_text("\n".join(lines))
    before = tree_hash(tree)
    pin = dataclasses.replace(load_pin(), tree=before)
    ok, results = check_patches(patches=patches, source=Source(tree, "llama-src", ""), pin=pin)
    assert not ok
    assert results[0].status == "FAILED" and results[0].patch == patches[0].name
    assert f in results[0].detail
    assert all(r.status == "not tried" for r in results[1:])
    with pytest.raises(PatchError, match=re.escape(f)):
        build_tree(Source(tree, "llama-src", ""), tmp_path / "out", pin, patches, overlay_entries())
    assert tree_hash(tree) == before


def test_broken_series_leaves_cache_untouched(tmp_path, prepared):
    """A data root whose series has a bad patch: prepare fails, names it; nothing half-made stays."""
    data = tmp_path / "data"
    for d in ("patches", "cpu_ref", "cuda", "glue"):
        if (data_root() / d).exists():
            shutil.copytree(data_root() / d, data / d, ignore=shutil.ignore_patterns("__pycache__"))
    pin = load_pin()
    sdir = data / "patches" / pin.series
    up, _ = _synthetic(tmp_path)
    bad = sdir / "9999-bad.patch"
    bad.write_text(
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: t <t@t>\nDate: Sat, 1 Jan 2000 00:00:00 +0000\nSubject: [PATCH] bad\n\n---\n"
        " CMakeLists.txt | 1 +\n 1 file changed, 1 insertion(+)\n\n"
        "diff --git a/CMakeLists.txt b/CMakeLists.txt\n--- a/CMakeLists.txt\n+++ b/CMakeLists.txt\n"
        "@@ -1,3 +1,4 @@\n this line is not in CMakeLists.txt\n+# turbo\n neither is this\n also not\n"
        "-- \n2.39.5\n\n")
    with open(sdir / "series", "a") as f:
        f.write("9999-bad.patch\n")
    before = sorted(p.name for p in (prepared.path.parent).iterdir())
    r = run_cli("prepare", env={"TURBO_LLAMA_DATA": str(data)})
    assert r.returncode == 1
    assert "9999-bad.patch" in r.stderr and "CMakeLists.txt" in r.stderr and "Traceback" not in r.stderr
    after = sorted(p.name for p in (prepared.path.parent).iterdir())
    assert after == before
    assert (prepared.path / ".git" / "turbo-prepared.json").is_file()


# ---------------------------------------------------------------- export

def test_export_and_tarball(prepared, tmp_path):
    out = tmp_path / "tree"
    r = run_cli("prepare", "--out", out, "--tarball", tmp_path / "tl.tar.gz")
    assert r.returncode == 0, r.stderr
    assert tree_hash(out) == tree_hash(prepared.path)
    assert git(out, "rev-parse", "pristine^{tree}").strip() == load_pin().tree
    tb = tmp_path / "tl.tar.gz"
    assert tb.stat().st_size < 20 * 2**20, tb.stat().st_size
    with tarfile.open(tb) as tf:
        names = tf.getnames()
    top = names[0].split("/")[0]
    assert f"{top}/CMakeLists.txt" in names and f"{top}/TURBO_PREPARED.json" in names
    assert not any(n.split("/")[1] in ("docs", "models", "media", ".git") for n in names if "/" in n)
    # again: same bytes (reproducible), export is a no-op
    first = tb.read_bytes()
    r = run_cli("prepare", "--out", out, "--tarball", tb)
    assert r.returncode == 0 and tb.read_bytes() == first
    # refuses to overwrite a directory that is not a prepared tree
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    r = run_cli("prepare", "--out", other)
    assert r.returncode == 1 and "not a turbo-llama prepared tree" in r.stderr
    assert (other / "keep.txt").read_text() == "mine"


# ---------------------------------------------------------------- cache robustness

def test_concurrent_prepares_share_the_cache(tmp_path):
    cache = seed_cache(tmp_path / "cache")
    env = {**os.environ, "TURBO_LLAMA_CACHE": str(cache)}
    procs = [subprocess.Popen([sys.executable, "-m", "turbo_llama", "prepare"], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outs = [p.communicate(timeout=1200) for p in procs]
    for p, (o, e) in zip(procs, outs):
        assert p.returncode == 0, e
    paths = {re.search(r"prepared tree: (\S+)", o).group(1) for o, _ in outs}
    assert len(paths) == 1
    assert "waiting" in outs[0][1] + outs[1][1]
    assert [p.name for p in (cache / "prepared").iterdir()] == [Path(paths.pop()).name]


def test_read_only_cache_is_a_clear_error(tmp_path):
    mnt = tmp_path / "ro"
    mount_tmpfs(mnt, "ro", "size=1m")
    try:
        r = run_cli("prepare", env={"TURBO_LLAMA_CACHE": str(mnt / "cache")})
        assert r.returncode == 1
        assert "not writable" in r.stderr and "TURBO_LLAMA_CACHE" in r.stderr
        assert "Traceback" not in r.stderr
    finally:
        umount(mnt)


def test_disk_full_during_prepare_is_a_clear_error(tmp_path):
    mnt = tmp_path / "small"
    mount_tmpfs(mnt, "size=120m")
    try:
        cache = mnt / "cache"
        (cache / "downloads").mkdir(parents=True)
        from _toolkit import sdist_path
        shutil.copy2(sdist_path(), cache / "downloads")
        r = run_cli("prepare", env={"TURBO_LLAMA_CACHE": str(cache)})
        assert r.returncode == 1
        assert "no space left" in r.stderr.lower() and "Traceback" not in r.stderr
        # nothing half-written stays behind
        assert not [p for p in (cache / "upstream").iterdir()] if (cache / "upstream").exists() else True
        assert not (cache / "prepared").exists() or not any((cache / "prepared").iterdir())
    finally:
        umount(mnt)
