"""ggml type ids by name (GGML_TYPE_TURBO3, ...), read from a built tree's ggml.h.

No list of ids is kept here: every `GGML_TYPE_<NAME> = <id>` of ggml.h's `enum ggml_type` is taken
as it is, so types added to the patch series (turbo4, ...) appear without touching this file.

Which ggml.h: the one installed with the llama-cpp-python wheel that `turbo-llama build --python`
made (llama_cpp/include/ggml.h: the header of the libraries Python loads), else the one of the last
`turbo-llama build` (its build source tree).
"""
from __future__ import annotations

import importlib.util
import re
from functools import lru_cache
from pathlib import Path

from .build.installed import installed_info
from .errors import ToolkitError

_ENUM = re.compile(r"enum\s+ggml_type\s*\{(.*?)\};", re.S)
_ENTRY = re.compile(r"^\s*GGML_TYPE_(\w+)\s*=\s*(\d+)\s*,?\s*$")


def parse_ggml_types(header_text: str) -> dict[str, int]:
    """{"F32": 0, ..., "TURBO3": 100, ...} from ggml.h's enum ggml_type (GGML_TYPE_COUNT left out;
    commented-out entries, like the removed Q4_2, are not types)."""
    m = _ENUM.search(header_text)
    if m is None:
        raise ToolkitError("no `enum ggml_type { ... };` in this ggml.h")
    types = {}
    for line in m.group(1).splitlines():
        e = _ENTRY.match(line.split("//", 1)[0])
        if e and e.group(1) != "COUNT":
            types[e.group(1)] = int(e.group(2))
    if not types:
        raise ToolkitError("ggml.h's enum ggml_type lists no types")
    return types


def header_candidates() -> list[Path]:
    """Where ggml.h is looked for, in order (existing or not)."""
    out = []
    spec = importlib.util.find_spec("llama_cpp")  # finds the package without loading its library
    if spec is not None and spec.submodule_search_locations:
        for d in spec.submodule_search_locations:
            out.append(Path(d) / "include" / "ggml.h")
    info = installed_info()
    if info and info.get("build_src"):
        out.append(Path(info["build_src"]) / "ggml" / "include" / "ggml.h")
    return out


@lru_cache(maxsize=None)
def _types_of(path: str) -> dict[str, int]:
    return parse_ggml_types(Path(path).read_text(encoding="utf-8", errors="replace"))


def ggml_header() -> Path:
    for p in header_candidates():
        if p.is_file():
            return p
    raise ToolkitError("no built ggml.h found (looked in: "
                       + (", ".join(str(p) for p in header_candidates()) or "nothing installed or built")
                       + "). Run `turbo-llama build --python` (or `turbo-llama build`) first.")


def ggml_types(header: Path | None = None) -> dict[str, int]:
    """{"F32": 0, "F16": 1, ..., "TURBO3": 100, ...} of the built tree (or of `header`)."""
    return dict(_types_of(str(header or ggml_header())))


def kv_type(value: int | str, header: Path | None = None) -> int:
    """The ggml type id for `Llama(type_k=..., type_v=...)`: from a name as the command-line tools
    spell it ("turbo3", "f16", "q8_0"; any case, with or without GGML_TYPE_) or an id, checked."""
    types = ggml_types(header)
    known = ", ".join(n.lower() for n in types)
    if isinstance(value, str):
        key = value.strip().upper()
        key = key[len("GGML_TYPE_"):] if key.startswith("GGML_TYPE_") else key
        if key not in types:
            raise ValueError(f"unknown ggml type {value!r}; known types: {known}")
        return types[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"a ggml type is a name or an int id, not {type(value).__name__}")
    if value not in types.values():
        raise ValueError(f"{value} is not a ggml type id of this build; known types: "
                         + ", ".join(f"{n.lower()}={i}" for n, i in types.items()))
    return value
