"""Pristine upstream tree -> prepared tree (overlay + patch series), all or nothing.

A prepared tree is a git repository:
    commit 1  "pristine llama.cpp b<N> (<commit>)"   tag `pristine`  (tree == the pinned tree)
    commit 2  "overlay: turbo-llama sources"          tag `overlay`   (files listed in overlay)
    commit 3+ one per patch of patches/<series>/series, applied with plain `git am`
              (no 3-way, no fuzz)
Author/committer names and dates are fixed, so the same inputs give the same commits.

Prepared trees live in <cache>/prepared/<key>, key = hash of (pin, overlay files, patches); a
tree is built in a temp dir next to its target and renamed into place only when complete.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
import time
from pathlib import Path

from ..cachedir import cache_dir, disk_full_error, locked
from ..errors import ToolkitError
from ..util import git, rmtree, say
from .source import Pin, Source, get_source, load_pin, overlay_entries, series_patches, source_files

PREPARE_FORMAT = 1           # bump when the layout of a prepared tree changes
KEEP_PREPARED = 3            # prepared trees kept in the cache (newest first)
STAMP = "turbo-prepared.json"  # inside .git/, so the work tree stays exactly what git tracks
TARBALL_SKIP = {"docs", "models", "media", ".git"}  # not needed to build; dropped from tarballs
FIXED_DATE = "2000-01-01T00:00:00+0000"
GIT_ID = {"GIT_AUTHOR_NAME": "turbo-llama", "GIT_AUTHOR_EMAIL": "turbo-llama@localhost",
          "GIT_COMMITTER_NAME": "turbo-llama", "GIT_COMMITTER_EMAIL": "turbo-llama@localhost",
          "GIT_AUTHOR_DATE": FIXED_DATE, "GIT_COMMITTER_DATE": FIXED_DATE}


class PatchError(ToolkitError):
    def __init__(self, patch: Path, files: list[str], detail: str):
        self.patch, self.files, self.detail = patch, files, detail
        where = ", ".join(files) if files else "see below"
        super().__init__(f"patch {patch.name} does not apply to the pinned tree (file: {where}); "
                         f"nothing was changed.\n{detail}")


@dataclasses.dataclass
class Prepared:
    path: Path
    key: str
    source: Source
    patches: list[str]
    overlay: list[str]
    reused: bool = False


# ---------------------------------------------------------------- inputs and key

def inputs_key(pin: Pin, patches: list[Path], overlay: list[tuple[Path, str]]) -> str:
    h = hashlib.sha256()

    def add(tag: str, data: bytes):
        h.update(tag.encode() + b"\0" + len(data).to_bytes(8, "little") + data)

    add("format", str(PREPARE_FORMAT).encode())
    add("pin", pin.path.read_bytes())
    for p in patches:
        add("patch:" + p.name, p.read_bytes())
    for src, dst in overlay:
        for rel, f in _walk_files(src):
            add(f"overlay:{dst}/{rel}", f.read_bytes())
            add("mode", str(os.stat(f).st_mode & 0o111).encode())
    return h.hexdigest()[:16]


def _walk_files(src: Path):
    """(relative name, path) of a file, or of every file under a directory (sorted)."""
    if src.is_file():
        yield "", src
        return
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for n in sorted(filenames):
            f = Path(dirpath) / n
            yield str(f.relative_to(src)), f


# ---------------------------------------------------------------- copying

def copy_files(src_root: Path, names: list[str], dst_root: Path, skip_top: set[str] = frozenset()):
    for name in names:
        if name.split("/", 1)[0] in skip_top:
            continue
        s, d = src_root / name, dst_root / name
        d.parent.mkdir(parents=True, exist_ok=True)
        if os.path.islink(s):
            os.symlink(os.readlink(s), d)
        else:
            shutil.copy2(s, d)


def git_env() -> dict:
    """git's environment in a prepared tree: the fixed identity and dates (GIT_ID), no GIT_DIR & co."""
    env = {**os.environ, **GIT_ID}
    for k in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(k, None)
    return env


_FAIL_PATTERNS = [re.compile(r"error: patch failed: (.+?):\d+"),
                  re.compile(r"error: (.+?): does not exist in index"),
                  re.compile(r"error: (.+?): already exists in (?:index|working directory)"),
                  re.compile(r"error: (.+?): patch does not apply"),
                  re.compile(r"error: (.+?): No such file or directory")]


def _failed_files(output: str) -> list[str]:
    files = []
    for pat in _FAIL_PATTERNS:
        for m in pat.finditer(output):
            if m.group(1) not in files:
                files.append(m.group(1))
    return files


def apply_patch(tree: Path, patch: Path) -> None:
    """`git am` one patch (no 3-way, no fuzz); on failure abort and raise PatchError."""
    r = git("am", "--no-3way", "--keep-cr", "--whitespace=nowarn", str(patch), cwd=tree, env=git_env(),
            check=False)
    if r.returncode != 0:
        out = (r.stdout + r.stderr).strip()
        git("am", "--abort", cwd=tree, env=git_env(), check=False)
        if "Patch is empty" in out or "does not look like" in out:
            raise PatchError(patch, [], f"{patch.name} is not a git format-patch mail:\n{out}")
        raise PatchError(patch, _failed_files(out), out)


def init_repo(tree: Path, message: str, tag: str) -> None:
    git("init", "-q", "-b", "main", cwd=tree, env=git_env())
    for k, v in (("core.autocrlf", "false"), ("core.fileMode", "true"), ("gc.auto", "0"),
                 ("core.looseCompression", "1"), ("am.threeWay", "false"),
                 ("user.name", "turbo-llama"), ("user.email", "turbo-llama@localhost")):
        git("config", k, v, cwd=tree, env=git_env())
    commit_all(tree, message, tag)


def commit_all(tree: Path, message: str, tag: str) -> None:
    git("add", "-A", "-f", cwd=tree, env=git_env())
    git("commit", "-q", "--allow-empty", "--no-verify", "-m", message, cwd=tree, env=git_env())
    git("tag", "-f", tag, cwd=tree, env=git_env())


def build_tree(source: Source, dest: Path, pin: Pin, patches: list[Path],
               overlay: list[tuple[Path, str]], progress=None) -> None:
    """Create the prepared tree at `dest` (which must not exist). Raises PatchError."""
    note = progress or (lambda msg: None)
    dest.mkdir(parents=True)
    note(f"copy upstream {pin.label} from {source.origin}")
    copy_files(source.path, source_files(source), dest)
    note("commit pristine")
    init_repo(dest, f"pristine llama.cpp {pin.label}\n\nupstream commit {pin.commit}\n", "pristine")
    tree = git("rev-parse", "HEAD^{tree}", cwd=dest, env=git_env()).stdout.strip()
    if tree != pin.tree:
        raise ToolkitError(f"the copied upstream tree hashes to {tree}, not the pinned {pin.tree}")
    note(f"overlay {len(overlay)} path(s)")
    for src, dst in overlay:
        for rel, f in _walk_files(src):
            d = dest / dst / rel if rel else dest / dst
            d.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, d)
    commit_all(dest, "overlay: turbo-llama sources (cpu_ref/, cuda/, glue/)\n", "overlay")
    for i, p in enumerate(patches, 1):
        note(f"apply {i}/{len(patches)} {p.name}")
        apply_patch(dest, p)


# ---------------------------------------------------------------- prepare (cached)

def _make_tmp(parent: Path, prefix: str) -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


def read_stamp(tree: Path) -> dict | None:
    try:
        return json.loads((tree / ".git" / STAMP).read_text())
    except (OSError, ValueError):
        return None


def prepare(llama_src: Path | str | None = None, quiet: bool = False, _locked: bool = False) -> Prepared:
    """The prepared tree for the current inputs, from <cache>/prepared/<key> (made if missing)."""
    root = cache_dir()
    if not _locked:
        with locked(root):
            return prepare(llama_src, quiet, _locked=True)
    note = (lambda m: None) if quiet else say
    pin = load_pin()
    patches = series_patches(pin)
    overlay = overlay_entries(pin)
    key = inputs_key(pin, patches, overlay)
    final = root / "prepared" / key
    stamp = read_stamp(final)
    if stamp and stamp.get("key") == key:
        src = Source(Path(stamp["source_path"]), stamp["origin"], stamp["source"])
        if llama_src:  # still verify what the user handed us, so a wrong dir is never silently ignored
            src = get_source(llama_src, pin, root)
        os.utime(final)  # newest first when pruning
        note(f"prepared tree {key} is up to date ({final})")
        return Prepared(final, key, src, stamp["patches"], stamp["overlay"], reused=True)

    note(f"[prepare] fetch and verify llama.cpp {pin.label}")
    src = get_source(llama_src, pin, root)
    tmp = _make_tmp(final.parent, f".{key}-")
    try:
        build_tree(src, tmp / "t", pin, patches, overlay, progress=lambda m: note(f"[prepare] {m}"))
        st = {"key": key, "format": PREPARE_FORMAT, "pin": pin.commit, "build_number": pin.build_number,
              "series": pin.series, "origin": src.origin, "source": src.detail,
              "source_path": str(src.path), "patches": [p.name for p in patches],
              "overlay": [dst for _, dst in overlay],
              "head": git("rev-parse", "HEAD", cwd=tmp / "t", env=git_env()).stdout.strip(),
              "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        (tmp / "t" / ".git" / STAMP).write_text(json.dumps(st, indent=1))
        rmtree(final)  # an incomplete leftover (no stamp) from an older killed run
        os.replace(tmp / "t", final)
    except BaseException as e:
        rmtree(tmp)
        err = disk_full_error(e, final)
        if err:
            raise err from e
        raise
    rmtree(tmp)
    _prune(final.parent, keep=final)
    note(f"prepared tree {key}: {len(patches)} patch(es), {len(overlay)} overlay path(s) -> {final}")
    return Prepared(final, key, src, [p.name for p in patches], [dst for _, dst in overlay])


def _prune(parent: Path, keep: Path):
    trees = sorted((p for p in parent.iterdir() if p.is_dir() and not p.name.startswith(".")),
                   key=lambda p: p.stat().st_mtime, reverse=True)
    for p in trees[KEEP_PREPARED:]:
        if p != keep:
            rmtree(p)
    for p in parent.glob(".*"):  # temp dirs of killed runs (we hold the lock, so none is live)
        rmtree(p)


# ---------------------------------------------------------------- export

def export_tree(prep: Prepared, out: Path) -> Path:
    """Copy the prepared tree (with its git history) to `out`, atomically."""
    out = Path(out).expanduser().absolute()
    if out.exists():
        st = read_stamp(out)
        if st is None and any(out.iterdir()):
            raise ToolkitError(f"--out {out} exists and is not a turbo-llama prepared tree; "
                               f"remove it or choose another directory")
        if st and st.get("key") == prep.key:
            say(f"{out} is already the prepared tree {prep.key}")
            return out
    tmp = _make_tmp(out.parent, f".{out.name}-")
    try:
        shutil.copytree(prep.path, tmp / "t", symlinks=True)
        old = None
        if out.exists():
            old = out.parent / f".{out.name}-old-{os.getpid()}"
            os.replace(out, old)
        os.replace(tmp / "t", out)
        if old:
            rmtree(old)
    except BaseException as e:
        err = disk_full_error(e, out)
        if err:
            raise err from e
        raise
    finally:
        rmtree(tmp)
    return out


def _tar_filter(ti: tarfile.TarInfo) -> tarfile.TarInfo:
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.mtime = 946684800
    return ti


def write_tarball(prep: Prepared, out: Path, pin: Pin | None = None) -> Path:
    """A reproducible .tar.gz of the prepared tree without .git, docs/, models/, media/."""
    import gzip
    pin = pin or load_pin()
    out = Path(out).expanduser().absolute()
    if out.suffix not in (".gz", ".tgz"):
        out = out.with_name(out.name + ".tar.gz") if out.suffix != ".tar" else out.with_suffix(".tar.gz")
    top = f"llama.cpp-b{pin.build_number}-turbo-{prep.key}"
    names = [n for n in source_files(Source(prep.path, "prepared", "")) if n.split("/", 1)[0] not in TARBALL_SKIP]
    info = {"key": prep.key, "pin": pin.commit, "build_number": pin.build_number,
            "patches": prep.patches, "overlay": prep.overlay,
            "cmake_args": [f"-DLLAMA_BUILD_NUMBER={pin.build_number}", f"-DLLAMA_BUILD_COMMIT={pin.short}"],
            "note": "docs/, models/, media/ and .git were left out; configure with cmake_args so "
                    "--version reports the pin"}
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmpname = tempfile.mkstemp(prefix=f".{out.name}-", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tf:
            for n in names:
                tf.add(prep.path / n, arcname=f"{top}/{n}", recursive=False, filter=_tar_filter)
            data = (json.dumps(info, indent=1) + "\n").encode()
            ti = _tar_filter(tarfile.TarInfo(f"{top}/TURBO_PREPARED.json"))
            ti.size, ti.mode = len(data), 0o644
            import io
            tf.addfile(ti, io.BytesIO(data))
        os.replace(tmpname, out)
    except BaseException as e:
        Path(tmpname).unlink(missing_ok=True)
        err = disk_full_error(e, out)
        if err:
            raise err from e
        raise
    return out


# ---------------------------------------------------------------- patches check

@dataclasses.dataclass
class CheckResult:
    patch: str
    status: str      # "ok", "FAILED", "not tried"
    detail: str = ""


def check_patches(llama_src: Path | str | None = None, patches: list[Path] | None = None,
                  source: Source | None = None, pin: Pin | None = None) -> tuple[bool, list[CheckResult]]:
    """Apply the overlay and series to a throw-away copy of the pristine tree; report per patch."""
    pin = pin or load_pin()
    patches = series_patches(pin) if patches is None else patches
    overlay = overlay_entries(pin)
    root = cache_dir()
    if source is None:
        with locked(root):
            source = get_source(llama_src, pin, root)
    results: list[CheckResult] = []
    with tempfile.TemporaryDirectory(prefix="turbo-check-") as tmp:
        dest = Path(tmp) / "t"
        build_tree(source, dest, pin, [], overlay)
        failed = False
        for p in patches:
            if failed:
                results.append(CheckResult(p.name, "not tried", "an earlier patch failed"))
                continue
            try:
                apply_patch(dest, p)
                results.append(CheckResult(p.name, "ok"))
            except PatchError as e:
                failed = True
                results.append(CheckResult(p.name, "FAILED",
                                           f"file: {', '.join(e.files) or '?'}\n{e.detail}"))
    return not failed, results
