"""The eval's default texts, shipped with the package (no apt, no download).

Three texts of different kinds, so that a cache's quality is measured off the text it was tuned on too
(`turbo-llama eval --text jargon,kjv,code`; the report gives each and the worst):
  data/jargon.txt.xz  the Jargon File 4.4.7 (Debian jargon-text: /usr/share/doc/jargon-text/jargon.txt.gz,
                      decompressed; public domain): the default perplexity / KLD text
  data/kjv.txt.xz     the King James Bible (Debian bible-kjv: `bible -f Gen1:1-Rev22:21` with the verse
                      references stripped, as the NIAH haystack needs no numbers but the needle's; public domain)
  data/code.txt.xz    source code: 19 modules of CPython 3.11.7's standard library (argparse.py ... threading.py,
                      each under a `# ==== Lib/<file> ====` line), as CPython ships them; PSF License, whose
                      notice heads the text
They are unpacked once into <cache>/texts/ (the tools read files) and checked against the sha256 below
on every unpack; a text that does not match is refused, never used.
"""
from __future__ import annotations

import hashlib
import lzma
from importlib import resources
from pathlib import Path

TEXTS = {
    # name: (package data file, sha256 of the unpacked text, what it is)
    "jargon.txt": ("jargon.txt.xz", "40dfb4b98191a670a09a183d5798d50f243d23fdbd1495dcc0aca2ce5895ba97",
                   "the Jargon File 4.4.7"),
    "kjv.txt": ("kjv.txt.xz", "b5c4940bcfeee072c0935b5200d0f9d88a00a0199cb0961d16133458fcdfae5d",
                "the King James Bible"),
    "code.txt": ("code.txt.xz", "fe9cff659a0fc057fa3fa0d7631216ae5dea66a0df1d78d1ecab45e52ac223c0",
                 "Python 3.11.7 standard library source"),
}

# the names `--text` takes for the shipped texts, in the order the eval's report lists them
TEXT_NAMES = {"jargon": "jargon.txt", "kjv": "kjv.txt", "code": "code.txt"}


class TextError(RuntimeError):
    pass


def packaged_text(name: str, cache_texts: Path) -> Path:
    """Unpack the packaged text `name` into cache_texts (once; checked by sha256) and return its path."""
    packed, sha, what = TEXTS[name]
    out = cache_texts / name
    stamp = out.with_name(name + ".sha256")
    if out.is_file() and stamp.is_file() and stamp.read_text().strip() == sha \
            and stamp.stat().st_mtime >= out.stat().st_mtime:
        return out
    src = resources.files("turbo_llama").joinpath("data", packed)
    try:
        data = lzma.decompress(src.read_bytes())
    except (OSError, lzma.LZMAError) as e:
        raise TextError(f"the packaged text {packed} ({what}) cannot be read: {e}; reinstall turbo-llama "
                        "(or pass --text/--haystack FILE)") from e
    got = hashlib.sha256(data).hexdigest()
    if got != sha:
        raise TextError(f"the packaged text {packed} ({what}) is damaged: sha256 {got} != {sha}; "
                        "reinstall turbo-llama (or pass --text/--haystack FILE)")
    cache_texts.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(name + ".partial")
    tmp.write_bytes(data)
    tmp.replace(out)
    stamp.write_text(sha + "\n")
    return out
