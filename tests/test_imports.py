"""The package's structure (#49), read with ast from python/turbo_llama's own files (nothing is imported):
no import circle between its modules, no module importing another module's private (_name) names, and no
function or class defined at the top of two modules (each helper once).

Every import statement counts, a function-local one too, and so does a "turbo_llama.x.y:name" string (the
lazily loaded commands of cli.py)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "python" / "turbo_llama"
TARGET = re.compile(r"^(turbo_llama(?:\.\w+)*):(\w+)$")   # cli.py's "turbo_llama.build.cli:build_command"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def package_modules(pkg: Path) -> dict[str, Path]:
    """{"turbo_llama.build.tools": path, "turbo_llama": path of __init__.py, ...} (package data left out)."""
    out = {}
    for p in sorted(pkg.rglob("*.py")):
        parts = list(p.relative_to(pkg.parent).with_suffix("").parts)
        if len(parts) > 1 and parts[1] == "data":
            continue
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _imports(name: str, path: Path):
    """(module, name or None, local name, line) of every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(), str(path))
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, None, a.asname or a.name.split(".")[0], node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            for a in node.names:
                yield mod, a.name, a.asname or a.name, node.lineno
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and TARGET.match(node.value):
            m = TARGET.match(node.value)
            yield m.group(1), m.group(2), None, node.lineno


def _known(mod: str, modules: dict) -> str | None:
    """The package module `mod` is, or lies in (turbo_llama.eval.model.x -> turbo_llama.eval.model)."""
    while mod and mod not in modules:
        mod = mod.rpartition(".")[0]
    return mod or None


def analyse(pkg: Path) -> tuple[dict[str, set[str]], list[str]]:
    """The import graph between the package's modules, and its private-name imports ("file:line: ...")."""
    modules = package_modules(pkg)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    private = []
    for name, path in modules.items():
        aliases = set()   # local names bound to package modules: `from . import model as _model`, `import turbo_llama`
        for mod, what, local, line in _imports(name, path):
            if mod is None:
                continue
            sub = f"{mod}.{what}" if what else None
            target = sub if sub in modules else _known(mod, modules)
            if target is None:
                continue   # not ours
            if target != name:
                graph[name].add(target)
            if what and _private(what) and mod != name:
                private.append(f"{path.relative_to(pkg.parent)}:{line}: imports {what} from {mod}")
            if local and (what is None or sub in modules):
                aliases.add(local)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in aliases and _private(node.attr):
                private.append(f"{path.relative_to(pkg.parent)}:{node.lineno}: uses {node.value.id}.{node.attr}")
    return graph, private


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: each strongly connected set of two or more modules (Tarjan), as a sorted list."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def twice_defined(pkg: Path) -> dict[str, list[str]]:
    """Top-level functions and classes whose name is defined in more than one module."""
    where: dict[str, list[str]] = {}
    for name, path in package_modules(pkg).items():
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                where.setdefault(node.name, []).append(name)
    return {n: ms for n, ms in where.items() if len(ms) > 1}


def test_the_package_is_what_is_checked():
    modules = package_modules(PKG)
    assert {"turbo_llama", "turbo_llama.cli", "turbo_llama.util", "turbo_llama.build.tools",
            "turbo_llama.eval.run", "turbo_llama.bench.run"} <= set(modules)
    graph, _ = analyse(PKG)
    assert "turbo_llama.build.cli" in graph["turbo_llama.cli"]          # the lazy command strings count
    assert "turbo_llama.build.installed" in graph["turbo_llama.ggml_types"]


def test_no_import_circle():
    graph, _ = analyse(PKG)
    assert circles(graph) == []


def test_no_private_name_imported_from_another_module():
    _, private = analyse(PKG)
    assert private == []


def test_each_helper_defined_once():
    assert twice_defined(PKG) == {}


def test_the_checks_see_what_they_look_for(tmp_path):
    """A circle through a function-local import, a private name taken across modules, a helper written twice."""
    pkg = tmp_path / "turbo_llama"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import _ext\n")             # a package's own private module: allowed
    (pkg / "a.py").write_text("from .sub.b import helper\n\ndef sha256_file(p):\n    return p\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from .. import a as _a\n\ndef helper():\n    from ..a import _secret\n"
                                      "    return _a._other\n\ndef sha256_file(p):\n    return p\n")
    (pkg / "c.py").write_text('COMMANDS = {"x": "turbo_llama.sub.b:helper"}\n')
    graph, private = analyse(pkg)
    assert circles(graph) == [["turbo_llama.a", "turbo_llama.sub.b"]]
    assert graph["turbo_llama.c"] == {"turbo_llama.sub.b"}
    assert [p.split(": ", 1)[1] for p in private] == ["imports _secret from turbo_llama.a", "uses _a._other"]
    assert twice_defined(pkg) == {"sha256_file": ["turbo_llama.a", "turbo_llama.sub.b"]}
