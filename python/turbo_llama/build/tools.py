"""turbo-llama build: prepare -> sync -> configure -> build -> install.

Steps are restartable: the prepared tree is keyed by its inputs, the build source dir
(<cache>/src/llama.cpp) only gets files whose content changed (so ninja rebuilds only what a
changed patch touches, and ccache shares objects between trees), ninja itself resumes a killed
build, and the stamps (configure args, installed.json) are written only after success.
"""
from __future__ import annotations

import dataclasses
import filecmp
import json
import os
import re
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..cachedir import cache_dir, disk_full_error, locked
from ..errors import ToolkitError
from ..util import rmtree, say, sigterm_as_exit, tail, write_json_atomic
from .installed import INSTALLED, default_bin_dir
from .prepare import Prepared, prepare
from .source import Source, load_pin, source_files

# what we build and install (ggml-rpc-server only when GGML_RPC=ON, which is the default here)
TARGETS = ["llama-cli", "llama-completion", "llama-server", "llama-bench", "llama-perplexity",
           "llama-tokenize", "test-backend-ops", "test-quantize-fns"]
RPC_TARGET = "ggml-rpc-server"
CONFIG_STAMP = ".turbo-configure.json"
NINJA_STATUS = re.compile(r"^\[(\d+)/(\d+)\]")
# a compile or link step (llama-server's "Provisioning UI assets" step runs every time and
# changes nothing when the assets did not change, so it does not count as rebuilding)
WORK_STEP = re.compile(r"^\[\d+/\d+\] (Building|Linking)")
NOSPACE = re.compile(r"No space left on device|ENOSPC|Disk quota exceeded")


# ---------------------------------------------------------------- ninja, cmake, nvcc

def find_ninja() -> str:
    exe = shutil.which("ninja")
    if exe:
        return exe
    try:
        import ninja  # the PyPI package ships the binary
        p = Path(ninja.BIN_DIR) / "ninja"
        if p.is_file():
            return str(p)
    except ImportError:
        pass
    raise ToolkitError("ninja not found: pip install ninja (it is a dependency of turbo-llama)")


def find_cmake() -> str:
    exe = shutil.which("cmake")
    if exe:
        return exe
    try:
        import cmake
        p = Path(cmake.CMAKE_BIN_DIR) / "cmake"
        if p.is_file():
            return str(p)
    except ImportError:
        pass
    raise ToolkitError("cmake not found: pip install cmake (it is a dependency of turbo-llama)")


def find_nvcc() -> str | None:
    for c in (os.environ.get("CUDACXX"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return None


# ---------------------------------------------------------------- sync prepared tree -> build source

def sync_tree(src_root: Path, dst_root: Path) -> int:
    """Make dst a copy of src's files (not .git), touching only files whose content differs.

    Returns the number of files written or removed. Unchanged files keep their mtime, so ninja
    does not rebuild them; changed (or reverted) files get a fresh mtime, so it does.
    """
    names = source_files(Source(src_root, "prepared", ""))
    want = set(names)
    changed = 0
    dst_root.mkdir(parents=True, exist_ok=True)
    for n in names:
        s, d = src_root / n, dst_root / n
        if os.path.islink(s):
            if os.path.islink(d) and os.readlink(d) == os.readlink(s):
                continue
            _remove(d)
            d.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(s), d)
            changed += 1
            continue
        if d.is_file() and not d.is_symlink() and filecmp.cmp(s, d, shallow=False):
            if (os.stat(s).st_mode & 0o111) != (os.stat(d).st_mode & 0o111):
                shutil.copymode(s, d)
            continue
        _remove(d)
        d.parent.mkdir(parents=True, exist_ok=True)
        tmp = d.with_name(f".{d.name}.turbo-tmp")
        shutil.copyfile(s, tmp)
        shutil.copymode(s, tmp)
        os.replace(tmp, d)
        changed += 1
    for n in source_files(Source(dst_root, "build-src", "")):
        if n not in want:
            _remove(dst_root / n)
            changed += 1
    return changed


def _remove(p: Path):
    if p.is_symlink() or p.is_file():
        p.unlink()
    elif p.is_dir():
        rmtree(p)


# ---------------------------------------------------------------- configure / build

@dataclasses.dataclass
class BuildOptions:
    cuda: bool = False
    cuda_arch: str = "90"
    jobs: int | None = None
    build_dir: Path | None = None
    prefix: Path | None = None
    llama_src: Path | None = None
    targets: list[str] | None = None   # default: TARGETS (+ rpc)
    install: bool = True
    rpc: bool = True
    native: bool = True
    amx: bool = False
    extra_cmake: tuple[str, ...] = ()
    progress: bool = True


def cmake_args(opts: BuildOptions, pin, nvcc: str | None) -> list[str]:
    args = ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
            "-DBUILD_SHARED_LIBS=OFF",            # self-contained binaries: install = copy
            "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_OPENSSL=OFF",
            "-DLLAMA_BUILD_TESTS=ON", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=ON",
            "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_APP=OFF",
            f"-DLLAMA_BUILD_NUMBER={pin.build_number}", f"-DLLAMA_BUILD_COMMIT={pin.short}",
            f"-DGGML_RPC={'ON' if opts.rpc else 'OFF'}",
            f"-DGGML_NATIVE={'ON' if opts.native else 'OFF'}"]
    if opts.native and not opts.amx and platform.machine() in ("x86_64", "AMD64"):
        # -march=native turns on upstream's AMX matmul where the CPU lists AMX; at this pin it
        # crashed (SIGSEGV/SIGILL in ggml_backend_amx_mul_mat) on Gemma 3 Q4_K_M on our CI machines.
        # Explicit -mno-amx-* flags win over a later -march=native.
        no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        args += [f"-DCMAKE_C_FLAGS={no_amx}", f"-DCMAKE_CXX_FLAGS={no_amx}"]
    ccache = shutil.which("ccache")
    if ccache:
        args += [f"-DCMAKE_C_COMPILER_LAUNCHER={ccache}", f"-DCMAKE_CXX_COMPILER_LAUNCHER={ccache}"]
    else:
        args += ["-DGGML_CCACHE=OFF"]
    if opts.cuda:
        args += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={opts.cuda_arch}",
                 f"-DCMAKE_CUDA_COMPILER={nvcc}"]
        if ccache:
            args += [f"-DCMAKE_CUDA_COMPILER_LAUNCHER={ccache}"]
    else:
        args += ["-DGGML_CUDA=OFF"]
    return args + list(opts.extra_cmake)


def _run_logged(cmd: list[str], log: Path, cwd: Path, env: dict, bar_desc: str | None = None,
                show_progress: bool = True) -> tuple[int, int, bool]:
    """Run cmd, appending its output to `log`; feed a tqdm bar from ninja's [N/M] lines.

    Returns (returncode, compile/link steps run, saw "no work to do", saw a full disk). The full disk is
    seen in the stream itself: the log may live on that disk and lose the very line that says so.
    """
    from tqdm import tqdm
    bar = None
    last_decile = -1
    steps = 0
    no_work = False
    nospace = False
    with open(log, "a", buffering=1) as lf:  # line-buffered: the log is always current
        lf.write(f"\n$ {' '.join(cmd)}\n")
        lf.flush()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", bufsize=1)
        try:
            for line in proc.stdout:
                try:
                    lf.write(line)
                except OSError:
                    nospace = True  # the log's own disk is full; keep draining ninja's output
                if not nospace and NOSPACE.search(line):
                    nospace = True
                m = NINJA_STATUS.match(line)
                if m:
                    n, total = int(m.group(1)), int(m.group(2))
                    if WORK_STEP.match(line):
                        steps += 1
                    if bar_desc and show_progress and not sys.stderr.isatty():
                        # logs (CI): a plain line every 10% instead of a redrawn bar
                        pct = 100 * n // max(total, 1)
                        if pct // 10 > last_decile:
                            last_decile = pct // 10
                            print(f"turbo-llama:   {bar_desc}: {n}/{total} ({pct}%)", file=sys.stderr, flush=True)
                    elif bar_desc and show_progress:
                        if bar is None:
                            bar = tqdm(total=total, desc=bar_desc, unit="step", file=sys.stderr,
                                       dynamic_ncols=True, mininterval=0.5)
                        bar.total = total
                        bar.update(n - bar.n)
                elif "ninja: no work to do" in line:
                    no_work = True
            rc = proc.wait()
        except BaseException:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
        finally:
            if bar is not None:
                bar.close()
    return rc, steps, no_work, nospace


def _disk_nearly_full(path: Path, min_free: int = 4 << 20) -> bool:
    try:
        return shutil.disk_usage(path).free < min_free
    except OSError:
        return False


def _fail(what: str, log: Path, rc: int, nospace: bool = False) -> ToolkitError:
    last = tail(log, 40)
    # two witnesses: ninja's output as it streamed (the log is a copy, and may sit on the full disk), and
    # the disk itself (a compiler that cannot write its output does not always say why)
    if nospace or _disk_nearly_full(log.parent):
        return ToolkitError(f"{what} failed: no space left on the device (see {log}). The build dir "
                            f"keeps only complete outputs; free some space (or point "
                            f"TURBO_LLAMA_CACHE / --build-dir at a bigger disk) and run "
                            f"`turbo-llama build` again.")
    return ToolkitError(f"{what} failed (exit {rc}). Last lines of the log:\n{last}\nFull log: {log}")


@dataclasses.dataclass
class BuildResult:
    build_dir: Path
    binaries: dict[str, str]
    installed: dict[str, str]
    bin_dir: Path | None
    compiled_steps: int
    nothing_rebuilt: bool
    prepared: Prepared
    log: Path


def nvcc_for(opts: BuildOptions) -> str | None:
    """The CUDA compiler when opts asks for CUDA (checked before anything is prepared or locked), else None."""
    if not opts.cuda:
        return None
    nvcc = find_nvcc()
    if not nvcc:
        raise ToolkitError("--cuda needs the CUDA compiler, but nvcc was not found (not on PATH, "
                           "not in /usr/local/cuda/bin, $CUDACXX unset). Install the CUDA toolkit "
                           "or build without --cuda.")
    return nvcc


def build(opts: BuildOptions | None = None) -> BuildResult:
    opts = opts or BuildOptions()
    nvcc = nvcc_for(opts)
    cmake, ninja = find_cmake(), find_ninja()
    root = cache_dir()
    with locked(root), sigterm_as_exit():
        try:
            return _build_locked(opts, root, cmake, ninja, nvcc)
        except OSError as e:
            err = disk_full_error(e, getattr(e, "filename", None) or opts.build_dir or root)
            if err:
                raise err from e
            raise


def _build_locked(opts: BuildOptions, root: Path, cmake: str, ninja: str, nvcc: str | None) -> BuildResult:
    pin = load_pin()
    variant = f"cuda-{opts.cuda_arch}" if opts.cuda else "cpu"
    say(f"[1/5 prepare] llama.cpp {pin.label} + patches/{pin.series}")
    prep = prepare(opts.llama_src, _locked=True)

    # the tree builds compile: stable path, content-synced (see module doc)
    src = root / "src" / "llama.cpp"
    marker = root / "src" / "llama.cpp.json"
    say(f"[2/5 sync] {src}")
    try:
        cur = json.loads(marker.read_text()) if marker.is_file() else {}
    except ValueError:
        cur = {}
    if cur.get("key") != prep.key or not (src / "CMakeLists.txt").is_file():
        marker.unlink(missing_ok=True)
        try:
            n = sync_tree(prep.path, src)
        except OSError as e:
            raise (disk_full_error(e, src) or ToolkitError(f"cannot write {src}: {e}")) from e
        marker.write_text(json.dumps({"key": prep.key, "prepared": str(prep.path)}))
        say(f"  {n} file(s) changed")

    build_dir = Path(opts.build_dir).expanduser().absolute() if opts.build_dir else root / "build" / variant
    build_dir.mkdir(parents=True, exist_ok=True)
    log = build_dir / "turbo-build.log"
    log.write_text(f"turbo-llama build {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    env = {**os.environ}
    # ccache: rewrite paths relative to the cache root, so any cache location shares objects
    env.setdefault("CCACHE_BASEDIR", str(root))
    env.setdefault("CCACHE_NOHASHDIR", "1")
    env["NINJA_STATUS"] = "[%f/%t] "

    args = cmake_args(opts, pin, nvcc)
    cfg = {"args": args, "src": str(src), "cmake": cmake}
    stamp = build_dir / CONFIG_STAMP
    try:
        old = json.loads(stamp.read_text()) if stamp.is_file() else None
    except ValueError:
        old = None
    if old != cfg or not (build_dir / "build.ninja").is_file():
        say(f"[3/5 configure] cmake {' '.join(a for a in args if a.startswith('-DGGML_CUDA') or a.startswith('-DLLAMA_BUILD_N'))}")
        stamp.unlink(missing_ok=True)
        rc, _, _, nospace = _run_logged([cmake, "-S", str(src), "-B", str(build_dir), *args], log, build_dir, env)
        if rc != 0:
            raise _fail("cmake configure", log, rc, nospace)
        stamp.write_text(json.dumps(cfg, indent=1))
    else:
        say("[3/5 configure] up to date")

    targets = list(opts.targets or TARGETS + ([RPC_TARGET] if opts.rpc else []))
    jobs = opts.jobs or os.cpu_count() or 2
    say(f"[4/5 build] ninja -j{jobs} ({len(targets)} targets; log: {log})")
    t0 = time.time()
    rc, steps, no_work, nospace = _run_logged([ninja, "-C", str(build_dir), f"-j{jobs}", *targets], log,
                                     build_dir, env, bar_desc="build", show_progress=opts.progress)
    if rc != 0:
        raise _fail("the build", log, rc, nospace)
    dt = time.time() - t0
    no_work = no_work or steps == 0
    if no_work:
        say("  nothing rebuilt: no compile or link step was needed")
    else:
        say(f"  {steps} compile/link step(s) in {dt:.0f} s")

    binaries = {}
    for t in targets:
        p = build_dir / "bin" / t
        if not p.is_file():
            raise ToolkitError(f"the build finished but {p} is missing; see {log}")
        binaries[t] = str(p)

    installed, bin_dir = {}, None
    if opts.install:
        bin_dir = default_bin_dir(opts.prefix)
        say(f"[5/5 install] {len(binaries)} binaries -> {bin_dir}")
        installed = install_binaries(binaries, bin_dir)
        on_path = [Path(p).resolve() for p in os.environ.get("PATH", "").split(os.pathsep) if p]
        if bin_dir.resolve() not in on_path:
            say(f"  warning: {bin_dir} is not on PATH; add it (export PATH={bin_dir}:$PATH) or use "
                 f"full paths (turbo-llama info lists them)")
    else:
        say("[5/5 install] skipped")

    info = {"pin": pin.commit, "build_number": pin.build_number, "series": pin.series,
            "origin": prep.source.origin, "source": prep.source.detail, "prepared_key": prep.key,
            "prepared_tree": str(prep.path), "build_src": str(src),
            "patches": prep.patches, "overlay": prep.overlay, "build_dir": str(build_dir),
            "cuda": bool(opts.cuda), "cuda_arch": opts.cuda_arch if opts.cuda else None,
            "cmake_args": args, "binaries": binaries, "installed": installed,
            "bin_dir": str(bin_dir) if bin_dir else None,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    write_json_atomic(build_dir / "turbo-build.json", info)
    if opts.targets is None:  # a full build: what find_tool() and `info` report
        write_json_atomic(root / INSTALLED, info)
    return BuildResult(build_dir, binaries, installed, bin_dir, 0 if no_work else steps, no_work, prep, log)


def install_binaries(binaries: dict[str, str], bin_dir: Path) -> dict[str, str]:
    try:
        bin_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ToolkitError(f"cannot create {bin_dir} ({e.strerror}); use --prefix DIR")
    out = {}
    for name, src in binaries.items():
        dst = bin_dir / name
        if dst.is_file() and filecmp.cmp(src, dst, shallow=False):
            out[name] = str(dst)
            continue
        tmp = bin_dir / f".{name}.turbo-tmp"
        try:
            shutil.copy2(src, tmp)
            os.replace(tmp, dst)  # atomic, and works while the old binary is running
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise (disk_full_error(e, dst) or ToolkitError(f"cannot install {dst} ({e.strerror}); "
                                                           f"use --prefix DIR")) from e
        out[name] = str(dst)
    return out
