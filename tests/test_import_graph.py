"""No import loop between the modules of ``flowserve``: each file's imports form a DAG.

import-linter's ``layers`` contract orders the packages; this checks the modules inside them too, counting
every import a module makes: at the top, inside a function, and under ``TYPE_CHECKING`` (a type-only import
that runs back up is still a loop for a reader, and the usual way to hide one). ``from P import name`` is an
import of module ``P.name`` when that is a module, else of ``P``; importing ``P.m`` is not counted as an
import of ``P/__init__.py``, as Python's own import of the parent package is no edge anyone wrote.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "flowserve"

#: packages that still hold a loop among their modules, each being taken apart in its own change. A loop
#: whose modules all lie in one of these packages is tolerated; one anywhere else fails, and so does an
#: entry here once its package has no loop left (take it out then).
KNOWN_LOOPS: dict[str, str] = {}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def _resolve(name: str, known: Iterable[str]) -> str | None:
    """The longest prefix of dotted ``name`` that is one of our modules (None: not ours)."""
    known = set(known)
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            return candidate
    return None


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Our modules that module ``name`` (the file ``path``) imports, anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            resolved = _resolve(target, known)
            if resolved is not None and resolved != name:
                found.add(resolved)
    return found


def import_graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports_of(name, path, known) for name, path in found.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module: each is one or more loops."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def a_loop(graph: dict[str, set[str]], members: list[str]) -> list[str]:
    """One loop through the first of ``members`` (a strongly connected component), for the message."""
    inside = set(members)
    start = members[0]
    paths = {start: [start]}
    todo = [start]
    while todo:  # breadth first, so the loop printed is a shortest one back to the start
        v = todo.pop(0)
        for w in sorted(graph[v] & inside):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                todo.append(w)
    raise AssertionError(f"{members} is not strongly connected")


def _package_of(members: list[str]) -> str | None:
    """The known-loop package that holds every one of ``members``, if any."""
    for package in KNOWN_LOOPS:
        if all(m == package or m.startswith(package + ".") for m in members):
            return package
    return None


def test_the_modules_of_flowserve_import_each_other_without_a_loop() -> None:
    graph = import_graph()
    loops = [c for c in strongly_connected(graph) if _package_of(c) is None]
    report = "\n".join(" -> ".join(a_loop(graph, c)) for c in loops)
    assert not loops, f"import loops (move the shared part down so the imports run one way):\n{report}"


def test_every_known_loop_is_still_there() -> None:
    graph = import_graph()
    holding = {_package_of(c) for c in strongly_connected(graph)}
    gone = sorted(set(KNOWN_LOOPS) - holding)
    assert not gone, f"no loop left in {', '.join(gone)}: take it out of KNOWN_LOOPS in {Path(__file__).name}"


def test_the_graph_sees_loops_hidden_in_functions_and_type_checking_blocks(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n")
    (pkg / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    (pkg / "d.py").write_text("from pkg import a\n")
    names = {"pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d"}
    graph = {n: imports_of(n, tmp_path / (n.replace(".", "/") + ("/__init__.py" if n == "pkg" else ".py")), names)
             for n in names}
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": {"pkg.a"}, "pkg.d": {"pkg.a"}}
    (loop,) = strongly_connected(graph)
    assert loop == ["pkg.a", "pkg.b", "pkg.c"]
    assert a_loop(graph, loop) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
