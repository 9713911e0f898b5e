"""The codec layer's shape, measured (issue 43's goals): printed with `-s`, asserted here.

- files in comm/ over 450 lines: none (TorchRec's door is a package, comm/torchrec/);
- attributes set on TorchRec's modules outside the door: none (the run's counters are one
  registry, `stats.CommCounters`, handed back by the sharding, never found by scanning modules);
- codec names in comm/registry.py's logic: none (each codec declares what it is: `dedups`,
  `sides`, `runs_under_two_levels`; the registration table alone names them);
- modules outside config/ that name the placement's key (`dedup_at`): at most 3 (20 before; the
  placement, comm/placement.py, is asked; labels.py holds the key's name for the run identity).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "dlrmtrain"
COMM = PACKAGE / "comm"
DOOR = COMM / "torchrec"
LONGEST = 450


def long_comm_files(longest: int = LONGEST) -> list[str]:
    """comm/ files over `longest` lines, with their lengths."""
    return [f"{p.relative_to(PACKAGE)}: {n}" for p in sorted(COMM.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > longest]


def _bound_from_modules(tree: ast.AST) -> set[str]:
    """Names bound to what `.modules()` yields: a loop's target, or an assignment whose value walks it."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.comprehension)) and ".modules()" in ast.unparse(node.iter):
            names |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Assign) and ".modules()" in ast.unparse(node.value):
            names |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def _sharded_subclasses(tree: ast.AST) -> list[ast.ClassDef]:
    """Classes of this file built on TorchRec's sharded modules (a base named Sharded... or ...Sharded...)."""
    return [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
            and any("Sharded" in ast.unparse(b) for b in n.bases)]


def attributes_set_on_torchrec_modules(comm: Path = COMM) -> list[str]:
    """`file:line` of every attribute the codec layer sets on a TorchRec module outside its door
    (comm/torchrec/): `setattr` on, or an attribute assigned to, a module found by walking
    `.modules()`, and `self.x = ...` in a class built on a TorchRec sharded module. (On the tree
    before issue 43: the 5 places that listed counters on the sharded modules.)"""
    found, package = [], comm.parent
    for path in sorted(comm.rglob("*.py")):
        if path.name == "torchrec_hooks.py" or comm / "torchrec" in path.parents:
            continue
        tree = ast.parse(path.read_text())
        walked = _bound_from_modules(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "setattr" and node.args \
                    and isinstance(node.args[0], ast.Name) and node.args[0].id in walked:
                found.append(f"{path.relative_to(package)}:{node.lineno}")
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found += [f"{path.relative_to(package)}:{node.lineno}" for t in targets
                          if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in walked]
        for cls in _sharded_subclasses(tree):
            found += [f"{path.relative_to(package)}:{n.lineno}" for n in ast.walk(cls)
                      if isinstance(n, (ast.Assign, ast.AnnAssign))
                      and any(isinstance(t, ast.Attribute) and ast.unparse(t.value) == "self"
                              for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]
    return found


def codec_names_in_registry_logic(registry: Path = COMM / "registry.py") -> list[str]:
    """`line: 'name'` of each string constant in `registry` that is a codec's name, outside the
    registration table (`_CODECS = ...`) and comparisons of a precision mode."""
    from dlrmtrain.comm.labels import CODEC_NAMES

    tree = ast.parse(registry.read_text())
    table = [n for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
             and ast.unparse(n.targets[0] if isinstance(n, ast.Assign) else n.target).startswith("_CODECS")]
    skipped = {id(n) for t in table for n in ast.walk(t)}
    # a precision mode that shares a codec's spelling (`table_precision != "bf16"`) names no codec
    skipped |= {id(c) for n in ast.walk(tree) if isinstance(n, ast.Compare) and "precision" in ast.unparse(n.left)
                for c in n.comparators}
    return [f"{n.lineno}: {n.value!r}" for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and n.value in CODEC_NAMES and id(n) not in skipped]


def test_no_comm_file_is_over_450_lines():
    long = long_comm_files()
    print(f"\ncomm/ files over {LONGEST} lines: {len(long)} {long}")
    assert not long


def test_nothing_is_set_on_torchrec_modules_outside_the_door():
    found = attributes_set_on_torchrec_modules()
    print(f"\nattributes set on TorchRec modules outside comm/torchrec/: {len(found)} {found}")
    assert not found


def test_registry_logic_names_no_codec():
    names = codec_names_in_registry_logic()
    print(f"\ncodec names in comm/registry.py's logic: {len(names)} {names}")
    assert not names


def files_naming(word: str, package: Path = PACKAGE) -> list[str]:
    """Modules of `package` outside config/ whose text names `word`."""
    return [str(p.relative_to(package)) for p in sorted(package.rglob("*.py"))
            if "config" not in p.relative_to(package).parts[:1] and word in p.read_text()]


def test_few_modules_name_the_placement_key():
    named = files_naming("dedup_at")
    print(f"\nmodules outside config/ naming dedup_at: {len(named)} {named}")
    assert len(named) <= 3
