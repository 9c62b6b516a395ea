"""The pin: sdist checksum, --llama-src verification (commit or tree hash)."""
from __future__ import annotations

import re
import shutil
import tarfile
from pathlib import Path

import pytest

from _toolkit import copy_tree, git, pristine_path, run_cli, sdist_path
from turbo_llama.errors import ToolkitError
from turbo_llama.build.source import fetch_sdist, load_pin, tree_hash, verify_llama_src


def test_pin_file_is_complete():
    # pin-agnostic (moving the pin edits pin.toml and patches/ only): the fields are well formed and agree
    pin = load_pin()
    assert pin.build_number > 0
    assert re.fullmatch(r"[0-9a-f]{40}", pin.commit) and re.fullmatch(r"[0-9a-f]{40}", pin.tree)
    assert re.fullmatch(r"[0-9a-f]{64}", pin.sdist_sha256)
    assert pin.series == f"b{pin.build_number}"
    series_dir = Path(__file__).resolve().parents[1] / "patches" / pin.series
    assert (series_dir / "series").is_file() and (series_dir / "overlay").is_file()


def test_corrupted_sdist_is_refused_and_removed(tmp_path):
    pin = load_pin()
    bad = tmp_path / "downloads" / pin.sdist_filename
    bad.parent.mkdir()
    data = bytearray(sdist_path().read_bytes())
    data[len(data) // 2] ^= 0x01
    bad.write_bytes(data)
    with pytest.raises(ToolkitError) as ei:
        fetch_sdist(pin, tmp_path)
    msg = str(ei.value)
    assert pin.sdist_sha256 in msg
    import hashlib
    assert hashlib.sha256(data).hexdigest() in msg
    assert not bad.exists()


def test_corrupted_sdist_cli_message(tmp_path):
    pin = load_pin()
    bad = tmp_path / "downloads" / pin.sdist_filename
    bad.parent.mkdir()
    data = bytearray(sdist_path().read_bytes())
    data[1000] ^= 0xFF
    bad.write_bytes(data)
    r = run_cli("prepare", env={"TURBO_LLAMA_CACHE": str(tmp_path)})
    assert r.returncode == 1
    assert "checksum mismatch" in r.stderr and pin.sdist_sha256 in r.stderr
    assert "Traceback" not in r.stderr
    assert not bad.exists()


def test_pristine_tree_hashes_to_the_pin():
    assert tree_hash(pristine_path()) == load_pin().tree


@pytest.fixture(scope="module")
def plain_copy(tmp_path_factory):
    """A copy of the pristine tree with no git metadata."""
    return copy_tree(pristine_path(), tmp_path_factory.mktemp("src") / "llama.cpp")


def test_plain_pristine_copy_is_accepted(plain_copy):
    src = verify_llama_src(plain_copy, load_pin())
    assert src.origin == "llama-src" and src.path == plain_copy


def test_plain_copy_with_build_dir_is_accepted(plain_copy):
    (plain_copy / "build").mkdir(exist_ok=True)
    (plain_copy / "build" / "x.o").write_text("object")
    try:
        verify_llama_src(plain_copy, load_pin())
    finally:
        shutil.rmtree(plain_copy / "build")


def test_plain_copy_with_changed_file_is_refused(plain_copy):
    f = plain_copy / "src" / "llama.cpp"
    orig = f.read_bytes()
    f.write_bytes(orig + b"\n// changed\n")
    try:
        with pytest.raises(ToolkitError, match="not the pinned tree"):
            verify_llama_src(plain_copy, load_pin())
    finally:
        f.write_bytes(orig)


def test_plain_copy_with_extra_file_is_refused(plain_copy):
    extra = plain_copy / "ggml" / "extra.c"
    extra.write_text("int x;\n")
    try:
        with pytest.raises(ToolkitError, match="not the pinned tree"):
            verify_llama_src(plain_copy, load_pin())
    finally:
        extra.unlink()


def test_git_repo_at_another_commit_is_refused(plain_copy, tmp_path):
    repo = copy_tree(plain_copy, tmp_path / "llama.cpp")
    git(repo, "init", "-q")
    git(repo, "add", "-A", "-f")
    git(repo, "commit", "-q", "-m", "copy of the pin")
    (repo / "README.md").write_text("changed\n")
    git(repo, "commit", "-q", "-am", "one more commit")
    with pytest.raises(ToolkitError, match="is at commit .* but turbo-llama is pinned"):
        verify_llama_src(repo, load_pin())
    r = run_cli("patches", "check", "--llama-src", repo)
    assert r.returncode == 1 and "pinned to" in r.stderr and "Traceback" not in r.stderr


def test_git_checkout_at_the_pin_is_accepted_and_local_changes_refused(tmp_path):
    """The sdist carries upstream's git metadata: a real checkout of the pinned commit."""
    pin = load_pin()
    with tarfile.open(sdist_path()) as tf:
        tf.extractall(tmp_path, filter="tar")
    repo = tmp_path / pin.sdist_subdir
    assert git(repo, "rev-parse", "HEAD").strip() == pin.commit
    src = verify_llama_src(repo, pin)
    assert src.files and "CMakeLists.txt" in src.files
    (repo / "src" / "llama.cpp").write_text("changed\n")
    with pytest.raises(ToolkitError, match="local changes"):
        verify_llama_src(repo, pin)


def test_not_a_llama_tree_is_refused(tmp_path):
    with pytest.raises(ToolkitError, match="not a llama.cpp source tree"):
        verify_llama_src(tmp_path, load_pin())


def test_no_network_fallback_fails_clearly(tmp_path, monkeypatch):
    """No sdist in the cache and no network: the message names every source tried."""
    from turbo_llama.build import source
    monkeypatch.setattr(source, "fetch_sdist",
                        lambda pin, root: (_ for _ in ()).throw(source._SdistUnavailable("pip: offline")))
    pin = load_pin()
    import dataclasses
    offline = dataclasses.replace(pin, git_url=str(tmp_path / "no-such-repo"))
    with pytest.raises(ToolkitError) as ei:
        source.get_source(None, offline, tmp_path)
    msg = str(ei.value)
    assert "pip: offline" in msg and "git clone" in msg and "--llama-src" in msg
    assert not list((tmp_path / "upstream").glob(".clone-*"))
