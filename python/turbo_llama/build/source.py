"""The pinned upstream source: where the data files are, the pin, and getting a verified tree.

Order of sources (first that applies wins):
  1. ``--llama-src DIR``: a git checkout at the pinned commit (clean), or a plain directory whose
     files hash (the git way) to the pinned tree; anything else is refused.
  2. the llama-cpp-python sdist from PyPI (``pip download``), sha256-verified, cached in
     <cache>/downloads; its vendor/llama.cpp is the pinned tree.
  3. ``git clone`` of the upstream repository at the pinned commit (needs internet).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from functools import lru_cache
from pathlib import Path

from ..cachedir import cache_dir, disk_full_error
from ..errors import ToolkitError
from ..util import git, say, sha256_file

# directories never part of the upstream tree (build outputs, VCS metadata)
EXCLUDE_TOP = {".git"}


def _is_build_dir(name: str, path: Path | None = None) -> bool:
    """A top-level build output dir (build/, build-*/, build_*/); files named build-* are sources."""
    if not (name == "build" or name.startswith("build-") or name.startswith("build_")):
        return False
    return path is None or (path.is_dir() and not path.is_symlink())


def source_files(src: Source) -> list[str]:
    """The files of a source tree, sorted: its explicit list, else every file but .git and the build dirs
    at the top (a symlink to a directory counts as a file, as for git)."""
    if src.files is not None:
        return sorted(src.files)
    out = []
    for dirpath, dirnames, filenames in os.walk(src.path):
        rel = os.path.relpath(dirpath, src.path)
        if rel == ".":
            dirnames[:] = [d for d in dirnames if d not in EXCLUDE_TOP and not _is_build_dir(d)]  # dirs only
            filenames = [f for f in filenames if f not in EXCLUDE_TOP]
        for d in list(dirnames):  # symlinks to dirs are files for git
            if os.path.islink(os.path.join(dirpath, d)):
                filenames.append(d)
                dirnames.remove(d)
        for f in filenames:
            out.append(f if rel == "." else os.path.join(rel, f))
    return sorted(out)


# ---------------------------------------------------------------- data files (patches, cpu_ref, ...)

def data_root() -> Path:
    """Directory holding patches/, cpu_ref/, cuda/, glue/.

    $TURBO_LLAMA_DATA if set; else the repository checkout this module runs from (editable
    install); else the copy installed with the wheel (turbo_llama/data/).
    """
    env = os.environ.get("TURBO_LLAMA_DATA")
    candidates = [Path(env)] if env else []
    package = Path(__file__).resolve().parents[1]   # turbo_llama/ (this file is turbo_llama/build/source.py)
    candidates += [package.parents[1], package / "data"]
    for c in candidates:
        if (c / "patches" / "pin.toml").is_file():
            return c
    raise ToolkitError("cannot find the turbo-llama data files (patches/pin.toml); looked in "
                       + ", ".join(str(c) for c in candidates)
                       + ". Reinstall turbo-llama or set TURBO_LLAMA_DATA to the repository root.")


@dataclasses.dataclass(frozen=True)
class Pin:
    build_number: int
    commit: str
    tree: str
    git_url: str
    sdist_name: str
    sdist_version: str
    sdist_filename: str
    sdist_sha256: str
    sdist_subdir: str
    series: str
    path: Path

    @property
    def short(self) -> str:
        return self.commit[:7]

    @property
    def label(self) -> str:
        return f"b{self.build_number} ({self.short})"


@lru_cache(maxsize=None)
def _load_pin(path: Path) -> Pin:
    with open(path, "rb") as f:
        d = tomllib.load(f)
    try:
        u, s, p = d["upstream"], d["sdist"], d["patches"]
        return Pin(build_number=int(u["build_number"]), commit=u["commit"], tree=u["tree"],
                   git_url=u["git_url"], sdist_name=s["name"], sdist_version=s["version"],
                   sdist_filename=s["filename"], sdist_sha256=s["sha256"].lower(),
                   sdist_subdir=s["subdir"], series=p["series"], path=path)
    except KeyError as e:
        raise ToolkitError(f"{path}: missing key {e}")


def load_pin(root: Path | None = None) -> Pin:
    return _load_pin((root or data_root()) / "patches" / "pin.toml")


def series_dir(pin: Pin | None = None, root: Path | None = None) -> Path:
    """patches/<series>/ (holds `series`, `overlay` and the patch files)."""
    root = root or data_root()
    pin = pin or load_pin(root)
    return root / "patches" / pin.series


def read_list(path: Path) -> list[str]:
    """Non-empty, non-comment lines of a list file (missing file = empty list)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line)
    return out


def series_patches(pin: Pin | None = None, root: Path | None = None) -> list[Path]:
    sdir = series_dir(pin, root)
    patches = [sdir / name for name in read_list(sdir / "series")]
    for p in patches:
        if not p.is_file():
            raise ToolkitError(f"{sdir / 'series'} lists {p.name}, which does not exist in {sdir}")
    return patches


def overlay_entries(pin: Pin | None = None, root: Path | None = None) -> list[tuple[Path, str]]:
    """(source path, destination relative to the upstream root) pairs from patches/<series>/overlay."""
    root = root or data_root()
    sdir = series_dir(pin, root)
    out = []
    for line in read_list(sdir / "overlay"):
        parts = line.split()
        if len(parts) != 2:
            raise ToolkitError(f"{sdir / 'overlay'}: expected 'SRC DST', got {line!r}")
        src, dst = root / parts[0], parts[1]
        if not src.exists():
            raise ToolkitError(f"{sdir / 'overlay'}: {parts[0]} does not exist under {root}")
        if dst.startswith("/") or ".." in Path(dst).parts:
            raise ToolkitError(f"{sdir / 'overlay'}: destination must be relative: {dst!r}")
        out.append((src, dst))
    return out


# ---------------------------------------------------------------- hashing a tree the git way

def tree_hash(path: Path, exclude: set[str] | None = None) -> str:
    """git tree hash of the files under `path` (as `git write-tree` would record them).

    Excludes .git and build dirs at the top. Uses a throw-away object store, so it works on any
    directory, with or without git metadata.
    """
    exclude = EXCLUDE_TOP | (exclude or set())
    with tempfile.TemporaryDirectory(prefix="turbo-hash-") as tmp:
        gitdir = Path(tmp) / "git"
        env = {**os.environ, "GIT_DIR": str(gitdir), "GIT_WORK_TREE": str(path),
               "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        for k in ("GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_CEILING_DIRECTORIES"):
            env.pop(k, None)
        clean = {k: v for k, v in env.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}
        git("init", "-q", "--bare", str(gitdir), env=clean)
        git("config", "core.looseCompression", "0", env=env)
        git("config", "core.autocrlf", "false", env=env)
        git("config", "core.fileMode", "true", env=env)
        git("config", "core.symlinks", "true", env=env)
        names = sorted(n for n in os.listdir(path)
                       if n not in exclude and not _is_build_dir(n, path / n))
        if names:
            # -f: include files a .gitignore would skip; the tree must be hashed exactly
            r = subprocess.run(["git", "add", "-A", "-f", "--", *names], cwd=path, env=env,
                               text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            if r.returncode != 0:
                raise ToolkitError(f"cannot hash the files of {path}: {r.stderr.strip()}")
        return git("write-tree", env=env).stdout.strip()


# ---------------------------------------------------------------- the source

@dataclasses.dataclass
class Source:
    path: Path          # upstream root (the directory with CMakeLists.txt, ggml/, src/ ...)
    origin: str         # "llama-src", "sdist", "git"
    detail: str         # the directory, sdist file or url
    files: list[str] | None = None  # explicit file list (git checkout: tracked files), else all


def _git_head(path: Path) -> str | None:
    r = git("rev-parse", "--verify", "-q", "HEAD", cwd=path, check=False)
    if r.returncode != 0:
        return None
    # only trust it if `path` itself is the top of that work tree (not a dir inside another repo)
    top = git("rev-parse", "--show-toplevel", cwd=path, check=False).stdout.strip()
    if not top or Path(top).resolve() != path.resolve():
        return None
    return r.stdout.strip()


def verify_llama_src(path: Path, pin: Pin) -> Source:
    path = Path(path).expanduser().absolute()
    if not (path / "CMakeLists.txt").is_file() or not (path / "ggml").is_dir():
        raise ToolkitError(f"--llama-src {path} is not a llama.cpp source tree "
                           f"(no CMakeLists.txt and ggml/ there)")
    head = _git_head(path) if (path / ".git").exists() else None
    if head is not None:
        if head != pin.commit:
            raise ToolkitError(f"--llama-src {path} is at commit {head}, but turbo-llama is pinned "
                               f"to {pin.commit} ({pin.label}). Check out the pin "
                               f"(git -C {path} checkout {pin.commit}) or omit --llama-src.")
        r = git("status", "--porcelain", "--untracked-files=no", cwd=path)
        if r.stdout.strip():
            changed = ", ".join(line[3:] for line in r.stdout.splitlines()[:5])
            raise ToolkitError(f"--llama-src {path} is at the pinned commit but has local changes "
                               f"({changed}). Stash or discard them, or omit --llama-src.")
        files = git("ls-files", "-z", cwd=path).stdout.split("\0")
        return Source(path, "llama-src", f"{path} (git, commit {head[:12]})",
                      files=[f for f in files if f])
    h = tree_hash(path)
    if h != pin.tree:
        raise ToolkitError(f"--llama-src {path} has no git metadata and its files hash to tree {h}, "
                           f"not the pinned tree {pin.tree} (llama.cpp {pin.label}): files were "
                           f"changed, added or removed (build outputs must be in build*/ dirs). "
                           f"Use a clean copy of the pinned commit or omit --llama-src.")
    return Source(path, "llama-src", f"{path} (tree {h[:12]})")


def verify_sdist(path: Path, pin: Pin) -> None:
    """Check the sdist's sha256; a mismatch deletes the file and stops."""
    got = sha256_file(path)
    if got != pin.sdist_sha256:
        path.unlink(missing_ok=True)
        raise ToolkitError(f"checksum mismatch for {path.name}: expected sha256 {pin.sdist_sha256}, "
                           f"got {got}. The file was deleted; run the command again to download it "
                           f"afresh (if it keeps failing, the download is being tampered with).")


def fetch_sdist(pin: Pin, root: Path) -> Path:
    """The verified sdist in <cache>/downloads, downloading it with pip if absent."""
    dl = root / "downloads"
    dl.mkdir(parents=True, exist_ok=True)
    target = dl / pin.sdist_filename
    if not target.is_file():
        say(f"downloading {pin.sdist_filename} with pip ...")
        with tempfile.TemporaryDirectory(prefix=".pip-", dir=dl) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", pin.sdist_name,
                   "--no-build-isolation", "--disable-pip-version-check",
                   f"{pin.sdist_name}=={pin.sdist_version}", "-d", tmp]
            r = subprocess.run(cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            got = Path(tmp) / pin.sdist_filename
            if r.returncode != 0 or not got.is_file():
                tail = "\n".join(r.stdout.strip().splitlines()[-8:])
                raise _SdistUnavailable(f"pip download failed (exit {r.returncode}):\n{tail}")
            os.replace(got, target)
    verify_sdist(target, pin)
    return target


class _SdistUnavailable(Exception):
    pass


def extract_under(archive: Path, prefix: str, dest: Path, skip: tuple[str, ...] = ()) -> None:
    """The members of a tar archive below `prefix` ("top/dir/"), extracted into `dest` without that prefix; a
    member that is one of `skip` or lies below one is left out."""
    with tarfile.open(archive) as tf:
        members = []
        for m in tf.getmembers():
            if not m.name.startswith(prefix):
                continue
            rel = m.name[len(prefix):]
            if not rel or any(rel == d or rel.startswith(d + "/") for d in skip):
                continue
            m.name = rel
            members.append(m)
        tf.extractall(dest, members=members, filter="tar")


def _unpack_sdist(sdist: Path, pin: Pin, root: Path) -> Path:
    dest = root / "upstream" / pin.commit
    if (dest / "CMakeLists.txt").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    prefix = pin.sdist_subdir.rstrip("/") + "/"
    tmp = Path(tempfile.mkdtemp(prefix=f".{pin.commit[:7]}-", dir=dest.parent))
    try:
        say(f"unpacking {prefix} from {sdist.name} ...")
        # the .git file points into the sdist's own git dir
        extract_under(sdist, prefix, tmp, skip=(".git",))
        h = tree_hash(tmp)
        if h != pin.tree:
            raise ToolkitError(f"{sdist.name}/{prefix} hashes to tree {h}, not the pinned {pin.tree}")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        err = disk_full_error(e, dest)
        if err:
            raise err from e
        raise
    return dest


def _clone(pin: Pin, root: Path) -> Path:
    dest = root / "upstream" / f"{pin.commit}-git"
    if (dest / "CMakeLists.txt").is_file() and _git_head(dest) == pin.commit:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".clone-", dir=dest.parent))
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    try:
        say(f"cloning {pin.git_url} at {pin.short} ...")
        steps = [["init", "-q", str(tmp)],
                 ["-C", str(tmp), "fetch", "-q", "--depth", "1", pin.git_url, pin.commit],
                 ["-C", str(tmp), "checkout", "-q", pin.commit]]
        for args in steps:
            r = subprocess.run(["git", *args], env=env, text=True, timeout=1800,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if r.returncode != 0:
                raise ToolkitError(f"git {' '.join(args[2:3] if args[0] == '-C' else args[:1])} failed: "
                                   f"{r.stdout.strip()[-600:]}")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def get_source(llama_src: Path | str | None = None, pin: Pin | None = None,
               root: Path | None = None) -> Source:
    """A verified pristine upstream tree, from the first source that works."""
    pin = pin or load_pin()
    root = root or cache_dir()
    if llama_src:
        return verify_llama_src(Path(llama_src), pin)
    try:
        sdist = fetch_sdist(pin, root)
    except _SdistUnavailable as e:
        sdist_err = str(e)
    else:
        return Source(_unpack_sdist(sdist, pin, root), "sdist", str(sdist))
    try:
        path = _clone(pin, root)
    except (ToolkitError, subprocess.TimeoutExpired) as e:
        raise ToolkitError(
            f"cannot obtain llama.cpp {pin.label}:\n"
            f"  1. PyPI sdist {pin.sdist_name}=={pin.sdist_version}: {sdist_err}\n"
            f"  2. git clone {pin.git_url}: {e}\n"
            f"Give a local checkout of commit {pin.commit} with --llama-src DIR, or put "
            f"{pin.sdist_filename} (sha256 {pin.sdist_sha256}) into {root / 'downloads'}.")
    return Source(path, "git", pin.git_url)
