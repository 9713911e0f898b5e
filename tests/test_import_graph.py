"""No import cycles anywhere in the dlrmtrain package.

The graph is built from the source with `ast`: every import, including those
inside functions (a cycle hidden by a local import is still a cycle), with
relative imports resolved. `from pkg import name` counts as importing
`pkg.name` when that is a module, else `pkg`.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dlrmtrain"


def module_files(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under `package`."""
    mods = {}
    for f in sorted(package.rglob("*.py")):
        parts = f.relative_to(package.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return mods


def imported_modules(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Modules of the package that `name` (at `path`) imports, anywhere in its body."""
    return {target for target, _ in import_sites(name, path, mods)}


def import_sites(name: str, path: Path, mods: dict[str, Path]) -> list[tuple[str, int]]:
    """(module of the package, line) of each import in `name` (at `path`), anywhere in its body."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                anchor = here[:len(here) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
        for target in targets:
            # `import a.b.c` also runs a and a.b; a package's own submodules importing it are not edges back
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                found.append((target, node.lineno))
    return found


def import_graph(package: Path) -> dict[str, set[str]]:
    mods = module_files(package)
    return {name: imported_modules(name, path, mods) for name, path in mods.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a path a -> ... -> a) per strongly connected component of more than one module.

    A component of more than two modules is also listed whole: every module in it must go.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

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
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, comp) + (["(all of: " + ", ".join(comp) + ")"] if len(comp) > 2 else [])
            for comp in components]


def _cycle_in(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first inside the component)."""
    inside, start = set(component), component[0]
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & inside):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start] + path[::-1][1:] + [start] if len(path) > 1 else [start, v, start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    return component


def test_cycle_finder_sees_cycles_hidden_in_functions(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import g\n")
    (pkg / "c.py").write_text("from . import a\n")
    (pkg / "d.py").write_text("import pkg.a\n")
    graph = import_graph(pkg)
    assert graph["pkg.sub.b"] == {"pkg.c"}
    assert graph["pkg.c"] == {"pkg.a"}
    assert graph["pkg.d"] == {"pkg.a"}
    assert find_cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a", "(all of: pkg.a, pkg.c, pkg.sub.b)"]]


def test_dlrmtrain_has_no_import_cycles():
    graph = import_graph(PACKAGE)
    assert "dlrmtrain.comm.embeddingbag" in graph and graph["dlrmtrain.comm.embeddingbag"]  # the graph is real
    cycles = find_cycles(graph)
    assert not cycles, "import cycles in dlrmtrain:\n" + "\n".join(" -> ".join(c) for c in cycles)
