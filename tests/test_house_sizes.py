"""The house's size rules (docs/design.md's map): no function in dlrmtrain/ over 60 lines (in
scripts/ over 80: a benchmark's report is longer than a library's function), no constructor
over 6 parameters (a family of settings travels as one spec object instead).

Read from the source with `ast`, as test_import_graph.py reads the imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dlrmtrain"
SCRIPTS = PACKAGE.parent / "scripts"
MAX_FUNCTION_LINES = 60
MAX_SCRIPT_FUNCTION_LINES = 80
MAX_CONSTRUCTOR_PARAMETERS = 6


def _functions(package: Path):
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path.relative_to(package.parent), node


def long_functions(package: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """`file:line name (N lines)` of each function longer than `limit` (def to last line)."""
    return [f"{path}:{f.lineno} {f.name} ({f.end_lineno - f.lineno + 1} lines)" for path, f in _functions(package)
            if f.end_lineno - f.lineno + 1 > limit]


def wide_constructors(package: Path) -> list[str]:
    """`file:line (N parameters)` of each `__init__` taking more than MAX_CONSTRUCTOR_PARAMETERS
    (self not counted, *args and **kwargs not counted: they hand on another's)."""
    out = []
    for path, f in _functions(package):
        if f.name == "__init__":
            n = len(f.args.posonlyargs) + len(f.args.args) + len(f.args.kwonlyargs) - 1
            if n > MAX_CONSTRUCTOR_PARAMETERS:
                out.append(f"{path}:{f.lineno} ({n} parameters)")
    return out


def test_no_function_in_dlrmtrain_is_over_60_lines():
    assert long_functions(PACKAGE) == []


def test_no_function_in_scripts_is_over_80_lines():
    assert long_functions(SCRIPTS, MAX_SCRIPT_FUNCTION_LINES) == []


def test_no_constructor_in_dlrmtrain_takes_over_6_parameters():
    assert wide_constructors(PACKAGE) == []


def test_the_finders_see_a_long_function_and_a_wide_constructor(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    (pkg / "m.py").write_text(f"def long():\n{body}\n\n\ndef short():\n    return 1\n\n\n"
                              "class C:\n    def __init__(self, a, b, c, d, e, f, *, g):\n        pass\n\n\n"
                              "class D:\n    def __init__(self, a, b, c, d, e, f, *args, **kwargs):\n        pass\n")
    assert long_functions(pkg) == ["pkg/m.py:1 long (61 lines)"]
    assert long_functions(pkg, limit=61) == []
    assert wide_constructors(pkg) == ["pkg/m.py:69 (7 parameters)"]
