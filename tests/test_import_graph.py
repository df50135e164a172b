"""fedray's modules import each other without a cycle, counting imports inside functions.

Why: a cycle hidden behind a function-local import still ties its modules together (neither
can be understood, tested or moved without the other) and fails at run time in whichever
order Python first meets it. docs/architecture.md lists what each folder may import; this
test is the part of it a machine can check.

The graph is read with ``ast``, so it sees every ``import`` statement of every module,
at module level or inside a function, a method or a conditional. Two things are not edges:
imports under ``if TYPE_CHECKING:`` (never executed: annotations only), and the parent
packages Python initialises on the way to a module (``from fedray.data.store.format import
X`` depends on ``format``, not on what ``fedray/data/store/__init__.py`` re-exports). An
import of a package's own name (``from fedray.data import Dataset``) is an edge to its
``__init__``.
"""

from __future__ import annotations

import ast
import itertools
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "fedray"


def module_names(root: pathlib.Path = PACKAGE) -> dict[str, pathlib.Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                skip.update(id(n) for n in ast.walk(stmt))
    return skip


def _targets(name: str, is_package: bool, node: ast.Import | ast.ImportFrom,
             modules: dict[str, pathlib.Path]) -> list[str]:
    if isinstance(node, ast.Import):
        wanted = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            here = name.split(".") if is_package else name.split(".")[:-1]
            here = here[:len(here) - (node.level - 1)]
            base = ".".join(here + ([node.module] if node.module else []))
        # from a.b import c: the module a.b.c when c is one, else a name of a.b
        wanted = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                  for a in node.names]
    out = []
    for target in wanted:
        while target and target not in modules:  # import a.b.c.d where d is a name
            target = target.rpartition(".")[0]
        if target and target != name:
            out.append(target)
    return out


def import_graph(root: pathlib.Path = PACKAGE) -> dict[str, dict[str, int]]:
    """module -> {imported fedray module: line of the first such import}."""
    modules = module_names(root)
    graph: dict[str, dict[str, int]] = {m: {} for m in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        skip = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skip:
                for target in _targets(name, path.name == "__init__.py", node, modules):
                    graph[name].setdefault(target, node.lineno)
    return graph


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle (its modules in import order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_graph_sees_every_kind_of_import(tmp_path):
    # a small package with a cycle through a function-local relative import, a
    # TYPE_CHECKING import (not an edge) and an import of a name re-exported by a package
    pkg = tmp_path / "fedray"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from fedray.sub.a import A\n")
    (pkg / "sub" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fedray import c\n"
        "A = 1\ndef f():\n    from .b import B\n")
    (pkg / "sub" / "b.py").write_text("import fedray.c\nB = 2\n")
    (pkg / "c.py").write_text("def g():\n    from fedray.sub import A\n")
    graph = import_graph(pkg)
    assert graph["fedray.sub.a"] == {"fedray.sub.b": 6}
    assert graph["fedray.sub.b"] == {"fedray.c": 1}
    assert graph["fedray.c"] == {"fedray.sub": 2}
    assert graph["fedray.sub"] == {"fedray.sub.a": 1}
    assert find_cycle(graph) == ["fedray.c", "fedray.sub", "fedray.sub.a", "fedray.sub.b",
                                 "fedray.c"]
    (pkg / "c.py").write_text("def g():\n    from fedray.sub.a import A\n")  # still a cycle
    assert find_cycle(import_graph(pkg)) is not None
    (pkg / "c.py").write_text("C = 3\n")
    assert find_cycle(import_graph(pkg)) is None


def test_fedray_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 100  # the whole package was read
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(
        f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(cycle)) + f" -> {cycle[-1]}"


def test_every_lazy_import_says_why():
    """An import inside a function is kept only where it saves start-up time (torch, Ray,
    pyarrow... load only when used), and says so: "start-up" in a comment on the lines just
    above it or above its block of imports, or in its module's docstring when the whole
    module works that way (fedray.api, fedray.cli). One without a reason belongs at the top
    of its module."""
    silent = []
    for name, path in module_names().items():
        src = path.read_text(encoding="utf-8")
        tree = ast.parse(src)
        lines = src.split("\n")
        head = (ast.get_docstring(tree) or "") + " ".join(
            line for line in lines[:60] if line.lstrip().startswith("#"))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                        t.startswith("fedray") for t in _targets(name, path.name == "__init__.py",
                                                                 node, module_names())):
                    start = node.lineno - 1  # the first line of its block of imports
                    while start > 0 and lines[start - 1].strip() and \
                            not lines[start - 1].lstrip().startswith(("#", '"""')):
                        start -= 1
                    above = " ".join(lines[max(0, start - 4):start])
                    if "start-up" not in above and "start-up" not in head:
                        silent.append(f"{name}:{node.lineno}")
    assert not silent, f"function-local imports that do not say why: {silent}"
