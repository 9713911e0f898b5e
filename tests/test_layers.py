"""Every arrow points down: the layers docs/design.md draws, held against the imports.

The picture is the fenced block after the line of docs/design.md that names this file: one
layer a line, top to bottom, each line's leading names (`trainer.py`, `run/`) the files
and folders of dlrmtrain/ that stand on it (words after them only describe). A module may
import only from the layers below its own: an import of a higher layer, or of another
file or folder of its own layer, fails, naming the file and line. So no two packages
import each other, and the picture cannot drift from the tree: a file or folder the
picture leaves out, or a name it draws that the tree lacks, fails too. Imports are read as
test_import_graph.py reads them (those inside functions included).
"""

from __future__ import annotations

from pathlib import Path

from tests.test_import_graph import PACKAGE, import_sites, module_files

DESIGN = PACKAGE.parent / "docs" / "design.md"


def design_layers(text: str, marker: str = "tests/test_layers.py") -> list[list[str]]:
    """The layers of the picture after the first line naming `marker`, bottom first."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if marker in line)
    fence = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
    end = next(i for i in range(fence + 1, len(lines)) if lines[i].startswith("```"))
    layers = []
    for line in lines[fence + 1:end]:
        names = []
        for word in line.split():
            if not (word.endswith(".py") or word.endswith("/")):
                break  # the description begins
            names.append(word)
        if names:
            layers.append(names)
    return layers[::-1]


def unit_of(path: Path, package: Path) -> str:
    """The file or folder of `package` that `path` stands in: `trainer.py`, `run/`."""
    parts = path.relative_to(package).parts
    return parts[0] + "/" if len(parts) > 1 else parts[0]


def arrows_against(layers: list[list[str]], package: Path) -> list[str]:
    """`file:line a -> b (why)` for each import that does not point down, and a line for each
    file or folder of `package` the layers leave out, or name it does not hold."""
    layer_of = {unit: i for i, layer in enumerate(layers) for unit in layer}
    mods = module_files(package)
    units = {unit_of(path, package) for path in mods.values()}
    problems = [f"{package.name}/{u}: in no layer of the picture" for u in sorted(units - set(layer_of))]
    problems += [f"{u}: drawn, but {package.name}/ holds no such file or folder"
                 for u in sorted(set(layer_of) - units)]
    for name, path in sorted(mods.items()):
        here = unit_of(path, package)
        for target, line in import_sites(name, path, mods):
            there = unit_of(mods[target], package)
            if there == here or here not in layer_of or there not in layer_of:
                continue
            if layer_of[there] >= layer_of[here]:
                why = "its own layer" if layer_of[there] == layer_of[here] else "a layer above"
                problems.append(f"{path.relative_to(package.parent)}:{line} {here} -> {there} ({why})")
    return problems


def test_the_picture_reads_as_layers_bottom_first():
    picture = "intro, see tests/test_layers.py:\n\n```\n top.py  cli/   the top\n\n mid/\n a.py  b/  c.py  words\n```\n"
    assert design_layers(picture) == [["a.py", "b/", "c.py"], ["mid/"], ["top.py", "cli/"]]


def test_the_finder_names_each_import_up_or_across_and_each_unit_out_of_the_picture(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "base.py").write_text("def f():\n    from pkg import top\n")  # up, in a function
    (pkg / "side.py").write_text("from pkg.low import base\nimport pkg.mid\n")  # down, then across
    (pkg / "mid.py").write_text("from .low.base import f\n")
    (pkg / "top.py").write_text("from pkg import mid, side\n")
    (pkg / "stray.py").write_text("")
    layers = [["low/"], ["mid.py", "side.py"], ["top.py", "__init__.py", "gone/"]]
    assert arrows_against(layers, pkg) == [
        "pkg/stray.py: in no layer of the picture",
        "gone/: drawn, but pkg/ holds no such file or folder",
        "pkg/low/base.py:2 low/ -> top.py (a layer above)",
        "pkg/side.py:2 side.py -> mid.py (its own layer)",
    ]


def test_every_arrow_in_dlrmtrain_points_down_the_layers_docs_design_md_draws():
    layers = design_layers(DESIGN.read_text())
    assert len(layers) > 5 and ["config/"] in layers  # the picture is real
    problems = arrows_against(layers, PACKAGE)
    assert not problems, ("imports against docs/design.md's layers (move the code, or redraw the "
                          "picture where the house changed):\n" + "\n".join(problems))
