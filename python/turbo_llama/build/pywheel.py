"""turbo-llama build --python: a llama-cpp-python wheel of the pinned sdist, on the prepared tree.

The pinned sdist (patches/pin.toml [sdist], the file the pin is downloaded as) is llama-cpp-python;
its vendor/llama.cpp is exactly the pinned upstream tree. The wheel is built from

    <cache>/python/src/<sdist dir>/                 the sdist's own files (vendor/llama.cpp left out)
                                                    + patches/<sdist name>-<version>/series (git am,
                                                    no fuzz), __version__ with a local label
    <cache>/python/src/<sdist dir>/vendor/llama.cpp the prepared tree `turbo-llama build` compiles

by `pip wheel` (scikit-build-core; pip fetches the build requirements from PyPI), with the CPU/CUDA
options of `turbo-llama build` (tools.cmake_args), ccache as compiler launcher and the CMake build
dir kept in <cache>/python/build/<variant>. Both trees are content-synced (unchanged files keep their
mtime), so a changed patch recompiles only what it touches. llama-cpp-python loads shared libraries
(libllama.so, libggml*.so): its CMakeLists.txt sets BUILD_SHARED_LIBS itself, so the objects are
position-independent and differ from the static CLI build's (ccache cannot share them).

Wheels are kept in <cache>/python/wheels/<variant>/, named by a key over every input (prepared
tree, Python patches, sdist, CMake options): a second run finds its wheel and builds nothing.
The version is <sdist version>+turbo.g<key> (PEP 440 local label).
"""
from __future__ import annotations

import dataclasses
import filecmp
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..cachedir import cache_dir, disk_full_error, locked
from ..errors import ToolkitError
from ..util import rmtree, say, sigterm_as_exit, tail, write_json_atomic
from .prepare import PatchError, Prepared, apply_patch, init_repo, prepare
from .source import Pin, Source, data_root, extract_under, fetch_sdist, load_pin, read_list, source_files
from .tools import BuildOptions, cmake_args, find_cmake, find_ninja, nvcc_for, sync_tree

PYWHEEL_FORMAT = 1       # bump when the staging or the build of the wheel changes
KEEP_WHEELS = 2          # wheels kept per variant (newest first)
VENDOR = "vendor/llama.cpp"
# what of `turbo-llama build`'s CMake options the wheel takes (same CPU/CUDA choice and flags); the
# rest (static libs, the tools, tests, RPC) is the CLI build's own business
SHARED_DEFINES = ("GGML_NATIVE", "CMAKE_C_FLAGS", "CMAKE_CXX_FLAGS", "CMAKE_C_COMPILER_LAUNCHER",
                  "CMAKE_CXX_COMPILER_LAUNCHER", "CMAKE_CUDA_COMPILER_LAUNCHER", "GGML_CCACHE",
                  "GGML_CUDA", "CMAKE_CUDA_ARCHITECTURES", "CMAKE_CUDA_COMPILER",
                  "LLAMA_BUILD_NUMBER", "LLAMA_BUILD_COMMIT")
# the Python package loads libllama and libggml*; left out to keep the build short (about half of the
# objects): llama.cpp's common library (unused by Python; llama-cpp-python's patch 0004 makes it optional) and the
# multimodal library mtmd (loaded only by the multimodal chat handlers): `--cmake-arg
# -DLLAVA_BUILD=ON` brings mtmd back
WHEEL_DEFINES = {"GGML_RPC": "OFF", "LLAVA_BUILD": "OFF", "LLAMA_BUILD_COMMON": "OFF"}
NINJA_LINE = re.compile(r"^\s*\[(\d+)/(\d+)\]")
VERSION_LINE = re.compile(r'^__version__ = "([^"]+)"$', re.M)


# ---------------------------------------------------------------- the Python patch series

def python_series_dir(pin: Pin | None = None) -> Path:
    """patches/<sdist name>-<version>/ (e.g. patches/llama-cpp-python-0.3.36/)."""
    pin = pin or load_pin()
    return data_root() / "patches" / f"{pin.sdist_name}-{pin.sdist_version}"


def python_patches(pin: Pin | None = None) -> list[Path]:
    sdir = python_series_dir(pin)
    if not (sdir / "series").is_file():
        raise ToolkitError(f"{sdir / 'series'} is missing: no llama-cpp-python patch series for the "
                           f"pinned sdist ({(pin or load_pin()).sdist_filename})")
    patches = [sdir / n for n in read_list(sdir / "series")]
    for p in patches:
        if not p.is_file():
            raise ToolkitError(f"{sdir / 'series'} lists {p.name}, which does not exist in {sdir}")
    return patches


def sdist_top(pin: Pin) -> str:
    """The sdist's top directory (llama_cpp_python-0.3.36), from the pin's vendor subdir."""
    top = pin.sdist_subdir.strip("/").split("/", 1)[0]
    if not pin.sdist_subdir.strip("/").endswith(VENDOR):
        raise ToolkitError(f"pin.toml: sdist subdir {pin.sdist_subdir!r} is not <top>/{VENDOR}")
    return top


def unpack_python_tree(sdist: Path, pin: Pin, dest: Path) -> None:
    """The sdist's files without vendor/llama.cpp (and without its bundled .git) into `dest`."""
    extract_under(sdist, sdist_top(pin) + "/", dest, skip=(VENDOR, ".git"))


def python_tree(sdist: Path, pin: Pin, patches: list[Path], dest: Path) -> None:
    """Pristine sdist files (a git repo, tag `pristine`) + the Python series. Raises PatchError."""
    dest.mkdir(parents=True)
    unpack_python_tree(sdist, pin, dest)
    init_repo(dest, f"pristine {pin.sdist_name} {pin.sdist_version} (without {VENDOR})\n", "pristine")
    for p in patches:
        apply_patch(dest, p)


def check_python_patches(patches: list[Path] | None = None) -> tuple[bool, list[tuple[str, str, str]]]:
    """Apply the Python series to a scratch copy of the sdist: (ok, [(patch, status, detail)])."""
    pin = load_pin()
    patches = python_patches(pin) if patches is None else patches
    root = cache_dir()
    with locked(root):
        sdist = fetch_sdist(pin, root)
    results, failed = [], False
    with tempfile.TemporaryDirectory(prefix="turbo-pycheck-") as tmp:
        dest = Path(tmp) / "t"
        python_tree(sdist, pin, [], dest)
        for p in patches:
            if failed:
                results.append((p.name, "not tried", "an earlier patch failed"))
                continue
            try:
                apply_patch(dest, p)
                results.append((p.name, "ok", ""))
            except PatchError as e:
                failed = True
                results.append((p.name, "FAILED", f"file: {', '.join(e.files) or '?'}\n{e.detail}"))
    return not failed, results


# ---------------------------------------------------------------- options, key, version

def wheel_defines(opts: BuildOptions, pin: Pin, nvcc: str | None) -> dict[str, str]:
    """-D options of the wheel: the CLI build's CPU/CUDA ones, ours, then the user's --cmake-arg."""
    defines: dict[str, str] = {}
    cli = cmake_args(dataclasses.replace(opts, extra_cmake=()), pin, nvcc)
    for a in cli:
        if a.startswith("-D"):
            k, _, v = a[2:].partition("=")
            if k in SHARED_DEFINES:
                defines[k] = v
    defines.update(WHEEL_DEFINES)
    for a in opts.extra_cmake:
        if not a.startswith("-D") or "=" not in a:
            raise ToolkitError(f"--python takes --cmake-arg only as -DNAME=VALUE, not {a!r}")
        k, _, v = a[2:].partition("=")
        defines[k.split(":", 1)[0]] = v  # -DNAME:TYPE=VALUE
    return defines


def wheel_key(prep: Prepared, pin: Pin, patches: list[Path], variant: str, defines: dict) -> str:
    h = hashlib.sha256()

    def add(tag: str, data: bytes):
        h.update(tag.encode() + b"\0" + len(data).to_bytes(8, "little") + data)

    add("format", str(PYWHEEL_FORMAT).encode())
    add("prepared", prep.key.encode())
    add("sdist", pin.sdist_sha256.encode())
    for p in patches:
        add("patch:" + p.name, p.read_bytes())
    add("variant", variant.encode())
    add("defines", json.dumps(defines, sort_keys=True).encode())
    return h.hexdigest()[:12]


def wheel_version(pin: Pin, key: str) -> str:
    # "g" + hex: a local label segment that is not all digits, so it is never renormalized
    return f"{pin.sdist_version}+turbo.g{key}"


def set_version(tree: Path, pin: Pin, version: str) -> None:
    """llama_cpp/__init__.py's __version__ (scikit-build-core reads the version from there)."""
    init = tree / "llama_cpp" / "__init__.py"
    text = init.read_text()
    found = VERSION_LINE.findall(text)
    if found != [pin.sdist_version]:
        raise ToolkitError(f"{init}: expected one `__version__ = \"{pin.sdist_version}\"`, found {found}")
    init.write_text(VERSION_LINE.sub(f'__version__ = "{version}"', text))


# ---------------------------------------------------------------- staging

def sync_python_files(src: Path, dst: Path) -> int:
    """Like tools.sync_tree, for the sdist's own files: dst/vendor/llama.cpp is left alone."""
    names = source_files(Source(src, "python", ""))
    want = set(names)
    changed = 0
    for n in names:
        s, d = src / n, dst / n
        if os.path.islink(s):
            if os.path.islink(d) and os.readlink(d) == os.readlink(s):
                continue
        elif d.is_file() and not d.is_symlink() and filecmp.cmp(s, d, shallow=False):
            continue
        d.parent.mkdir(parents=True, exist_ok=True)
        if d.is_symlink() or d.exists():
            d.unlink()
        if os.path.islink(s):
            os.symlink(os.readlink(s), d)
        else:
            shutil.copy2(s, d)
            os.utime(d)  # a fresh mtime: the build sees the change
        changed += 1
    if dst.is_dir():
        # (the sdist's CMakeLists.txt also installs the libraries into llama_cpp/lib/ of the source
        # tree; they are outputs, made again by every build, so they go like any file not in `src`)
        for n in source_files(Source(dst, "python-stage", "")):
            if n not in want and not n.startswith(VENDOR + "/"):
                (dst / n).unlink()
                changed += 1
    return changed


# ---------------------------------------------------------------- the build

@dataclasses.dataclass
class WheelResult:
    wheel: Path            # the wheel in the cache
    version: str
    built: bool            # False: the cached wheel of these inputs was used, nothing was compiled
    seconds: float         # time of the pip wheel run (0 when not built)
    installed: str | None  # "installed" / "already installed" / None (--wheel-dir or no install)
    python: str | None     # the interpreter it was installed for
    copied_to: Path | None
    record: Path


def target_python() -> str:
    """The active environment's interpreter: $VIRTUAL_ENV's, else the one running turbo-llama."""
    venv = os.environ.get("VIRTUAL_ENV")
    if venv:
        p = Path(venv) / "bin" / "python"
        if p.is_file():
            return str(p)
    return sys.executable


def installed_version(python: str, dist: str) -> str | None:
    r = subprocess.run([python, "-c", "import importlib.metadata as m, sys\n"
                        f"try: print(m.version({dist!r}))\nexcept m.PackageNotFoundError: pass"],
                       text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return r.stdout.strip() or None


def _tool_dirs() -> list[str]:
    """Dirs holding the real cmake and ninja binaries (pip's isolated build env then uses them
    instead of downloading cmake; a pyenv shim on PATH does not run there)."""
    dirs = []
    for mod, attr, find in (("cmake", "CMAKE_BIN_DIR", find_cmake), ("ninja", "BIN_DIR", find_ninja)):
        try:
            d = getattr(__import__(mod), attr)
            if (Path(d) / mod).is_file():
                dirs.append(str(d))
                continue
        except (ImportError, AttributeError):
            pass
        dirs.append(str(Path(find()).resolve().parent))
    return dirs


def _run_pip_wheel(cmd: list[str], log: Path, env: dict, progress: bool) -> int:
    """Run `pip wheel -v`, all output to `log`; a line every 10% of ninja's steps."""
    last = -1
    with open(log, "a", buffering=1) as lf:
        lf.write(f"\n$ {' '.join(cmd)}\n")
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", bufsize=1)
        try:
            for line in proc.stdout:
                lf.write(line)
                m = NINJA_LINE.match(line)
                if m and progress:
                    n, total = int(m.group(1)), int(m.group(2))
                    pct = 100 * n // max(total, 1)
                    if pct // 10 > last:
                        last = pct // 10
                        say(f"  wheel build: {n}/{total} ({pct}%)")
            return proc.wait()
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise


def build_wheel(opts: BuildOptions | None = None, wheel_dir: Path | None = None,
                install: bool = True, python: str | None = None, extras: tuple[str, ...] = ()) -> WheelResult:
    """Build (or find in the cache) the wheel; then copy it to wheel_dir, or install it (with the
    llama-cpp-python `extras`, e.g. "server") for `python` (default: the active environment's)."""
    opts = opts or BuildOptions()
    nvcc = nvcc_for(opts)
    root = cache_dir()
    with locked(root), sigterm_as_exit():
        try:
            res = _build_wheel_locked(opts, root, nvcc)
        except OSError as e:
            err = disk_full_error(e, getattr(e, "filename", None) or root)
            if err:
                raise err from e
            raise
    if wheel_dir is not None:
        res.copied_to = copy_wheel(res.wheel, Path(wheel_dir))
    elif install:
        res.python = python or target_python()
        res.installed = install_wheel(res.wheel, res.version, res.python, extras)
    return res


def _build_wheel_locked(opts: BuildOptions, root: Path, nvcc: str | None) -> WheelResult:
    pin = load_pin()
    variant = f"cuda-{opts.cuda_arch}" if opts.cuda else "cpu"
    patches = python_patches(pin)
    say(f"[1/4 prepare] llama.cpp {pin.label} + patches/{pin.series}; "
         f"{pin.sdist_name} {pin.sdist_version} + {python_series_dir(pin).name} ({len(patches)} patches)")
    prep = prepare(opts.llama_src, _locked=True)
    defines = wheel_defines(opts, pin, nvcc)
    key = wheel_key(prep, pin, patches, variant, defines)
    version = wheel_version(pin, key)
    base = root / "python"
    wheels = base / "wheels" / variant
    record = base / f"{variant}.json"
    dist = pin.sdist_name.replace("-", "_")
    cached = sorted(wheels.glob(f"{dist}-{version}-*.whl")) if wheels.is_dir() else []
    if cached:
        say(f"[2/4 wheel] {cached[0].name} is up to date: nothing rebuilt")
        os.utime(cached[0])
        return WheelResult(cached[0], version, False, 0.0, None, None, None, record)

    stage = base / "src" / sdist_top(pin)
    build_dir = base / "build" / variant
    build_dir.mkdir(parents=True, exist_ok=True)
    stage.mkdir(parents=True, exist_ok=True)
    log = build_dir / "turbo-wheel.log"
    log.write_text(f"turbo-llama build --python {time.strftime('%Y-%m-%d %H:%M:%S')} {version}\n")

    say(f"[2/4 stage] {stage}")
    sdist = fetch_sdist(pin, root)
    tmp = Path(tempfile.mkdtemp(prefix=".pytree-", dir=base))
    try:
        python_tree(sdist, pin, patches, tmp / "t")
        set_version(tmp / "t", pin, version)
        n = sync_python_files(tmp / "t", stage)
    finally:
        rmtree(tmp)
    n += sync_tree(prep.path, stage / VENDOR)
    say(f"  {n} file(s) changed")

    out = Path(tempfile.mkdtemp(prefix=".wheel-", dir=base))
    try:
        cmd = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--disable-pip-version-check",
               "-w", str(out), str(stage), f"-Cbuild-dir={build_dir / 'cmake'}"]
        if importlib.util.find_spec("scikit_build_core") is not None:
            # the build backend is a dependency of turbo-llama: use it as installed (no temporary
            # build environment, nothing downloaded); without it pip fetches it from PyPI
            cmd.append("--no-build-isolation")
        cmd += [f"-Ccmake.define.{k}={v}" for k, v in defines.items()]
        if opts.jobs:
            cmd += [f"-Cbuild.tool-args=-j{opts.jobs}"]
        env = {**os.environ, "NINJA_STATUS": "[%f/%t] ", "PATH": os.pathsep.join(
            [*_tool_dirs(), os.environ.get("PATH", "")])}
        # ccache: paths relative to the cache root, as for the CLI build (tools.py)
        env.setdefault("CCACHE_BASEDIR", str(root))
        env.setdefault("CCACHE_NOHASHDIR", "1")
        env.pop("CMAKE_ARGS", None)  # scikit-build-core would add them: the defines above are all
        say(f"[3/4 wheel] pip wheel {stage.name} ({variant}; log: {log})")
        t0 = time.time()
        rc = _run_pip_wheel(cmd, log, env, opts.progress)
        seconds = time.time() - t0
        got = sorted(out.glob(f"{dist}-{version}-*.whl"))
        if rc != 0 or not got:
            raise ToolkitError(f"the wheel build failed (pip exit {rc}). Last lines of the log:\n"
                               f"{tail(log, 40)}\nFull log: {log}")
        wheels.mkdir(parents=True, exist_ok=True)
        wheel = wheels / got[0].name
        os.replace(got[0], wheel)
    finally:
        rmtree(out)
    say(f"  built {wheel.name} in {seconds:.0f} s")
    for old in sorted(wheels.glob("*.whl"), key=lambda p: p.stat().st_mtime, reverse=True)[KEEP_WHEELS:]:
        old.unlink()
    write_json_atomic(record, {
        "version": version, "wheel": str(wheel), "key": key, "variant": variant,
        "prepared_key": prep.key, "prepared_tree": str(prep.path), "patches": prep.patches,
        "python_patches": [p.name for p in patches], "defines": defines, "stage": str(stage),
        "ggml_h": str(stage / VENDOR / "ggml" / "include" / "ggml.h"), "build_seconds": round(seconds, 1),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    return WheelResult(wheel, version, True, seconds, None, None, None, record)


def copy_wheel(wheel: Path, wheel_dir: Path) -> Path:
    wheel_dir = wheel_dir.expanduser().absolute()
    try:
        wheel_dir.mkdir(parents=True, exist_ok=True)
        dst = wheel_dir / wheel.name
        if not (dst.is_file() and filecmp.cmp(wheel, dst, shallow=False)):
            tmp = wheel_dir / f".{wheel.name}.turbo-tmp"
            shutil.copyfile(wheel, tmp)
            os.replace(tmp, dst)
    except OSError as e:
        raise (disk_full_error(e, wheel_dir) or ToolkitError(f"cannot write {wheel_dir}: {e}")) from e
    say(f"[4/4 wheel dir] {dst}")
    return dst


def install_wheel(wheel: Path, version: str, python: str, extras: tuple[str, ...] = ()) -> str:
    dist = wheel.name.split("-", 1)[0]
    if installed_version(python, dist) == version and not extras:
        say(f"[4/4 install] {dist} {version} is already installed for {python}")
        return "already installed"
    req = f"{wheel}[{','.join(extras)}]" if extras else str(wheel)
    say(f"[4/4 install] {wheel.name}{'[' + ','.join(extras) + ']' if extras else ''} -> {python} "
         f"(its dependencies from PyPI where missing)")
    r = subprocess.run([python, "-m", "pip", "install", "--disable-pip-version-check", req],
                       text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        tail = "\n".join(r.stdout.strip().splitlines()[-15:])
        raise ToolkitError(f"pip install of {wheel} failed (exit {r.returncode}):\n{tail}")
    got = installed_version(python, dist)
    if got != version:
        raise ToolkitError(f"after pip install, {python} has {dist} {got}, not {version}")
    return "installed"
