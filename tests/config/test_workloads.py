"""What differs per model family is its Workload's (dlrmtrain/workloads/): every family the
schema offers has one, validation and the builders ask it, and a new family is one
Workload plus its registration."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from dlrmtrain import workloads
from dlrmtrain.config import load_config
from dlrmtrain.config.loader import ConfigError
from dlrmtrain.config.schema import DataSource, ModelArch
from dlrmtrain.mlperf.benchmarks import BENCHMARKS
from dlrmtrain.validation import resolve_config, validate_config
from dlrmtrain.workloads import Workload, registry

PACKAGE = Path(workloads.__file__).resolve().parents[1]


def test_every_arch_and_source_of_the_schema_has_its_workload():
    assert set(registry.WORKLOADS) == set(get_args(ModelArch))
    read = {s for w in registry.WORKLOADS.values() for s in w.sources}
    assert read == set(get_args(DataSource))
    for arch, workload in registry.WORKLOADS.items():
        assert workload.arch == arch


def test_an_arch_without_a_workload_is_refused_naming_the_key():
    cfg = load_config(None)
    cfg.model.arch = "transformer"  # past the loader's Literal check
    with pytest.raises(ConfigError, match=r"model\.arch: 'transformer' is not one of dlrm_v1, "
                                          r"dlrm_dcnv2, dlrmv4_hstu"):
        validate_config(cfg, 2)


class ToyWorkload(Workload):
    """A family in one class: it records what it is asked and refuses what it is told to."""

    arch = "toy_arch"
    sources = ("synthetic",)

    def __init__(self):
        self.asked: list[str] = []
        self.refuse: str | None = None

    def _ask(self, what: str) -> None:
        self.asked.append(what)
        if what == self.refuse:
            raise ConfigError(f"toy refuses at {what}")

    def resolve(self, cfg):
        self._ask("resolve")
        cfg.data.table_sizes = [3]

    def check_data(self, cfg, world_size):
        self._ask("check_data")

    def check_model(self, cfg):
        self._ask("check_model")

    def check_pipeline(self, cfg):
        self._ask("check_pipeline")

    def table_names(self, cfg):
        self._ask("table_names")
        return ["toy_table"]

    def check_sharding(self, cfg):
        self._ask("check_sharding")

    def check_hierarchy(self, cfg):
        self._ask("check_hierarchy")

    def build_datasets(self, cfg, rank, world_size, pin_memory=False):
        return ("toy datasets", rank, world_size)

    def build_model(self, cfg, rows, dense_device):
        return ("toy model", rows)

    def shard(self, model, cfg, device, world_size):
        raise AssertionError("not asked here")

    def activation_memory(self, cfg, rows, local_batch, device_type):
        raise AssertionError("not asked here")

    def planned_table_rows(self, cfg):
        raise AssertionError("not asked here")

    def embedding_sharder(self, cfg, device_type):
        raise AssertionError("not asked here")


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setattr(registry, "WORKLOADS", dict(registry.WORKLOADS))  # the shipped ones, restored after
    workload = ToyWorkload()
    registry.register(workload)
    cfg = load_config(None)
    cfg.model.arch = workload.arch  # a new family also names itself in schema.ModelArch for the loader
    return workload, cfg


def test_a_new_family_is_one_workload_and_its_registration(toy):
    workload, cfg = toy
    validate_config(cfg, 2)
    assert workload.asked == ["resolve", "check_data", "check_model", "check_pipeline",
                              "table_names", "check_sharding", "check_hierarchy"]
    assert resolve_config(cfg).data.table_sizes == [3] and cfg.data.table_sizes is None
    assert workloads.build_datasets(cfg, 1, 2) == ("toy datasets", 1, 2)
    assert workloads.build_model(cfg, {"toy_table": 3}, "cpu") == ("toy model", {"toy_table": 3})
    with pytest.raises(ValueError, match="toy_arch.* has a workload already"):
        registry.register(ToyWorkload())


@pytest.mark.parametrize("refuse", ["resolve", "check_data", "check_model", "check_pipeline",
                                    "table_names", "check_sharding", "check_hierarchy"])
def test_what_the_family_refuses_is_refused(toy, refuse):
    workload, cfg = toy
    workload.refuse = refuse
    with pytest.raises(ConfigError, match=f"toy refuses at {refuse}"):
        validate_config(cfg, 2)


@pytest.mark.parametrize("overrides, message", [
    (["data.source=criteo"], r"data\.source: 'criteo' does not feed model\.arch 'toy_arch' "
                             r"\(it reads synthetic\)"),
    (["comm.table_codecs={t_cat_0: none}"], r"comm\.table_codecs\.t_cat_0: no such table"),
])
def test_the_shared_checks_use_the_familys_sources_and_tables(toy, overrides, message):
    cfg = load_config(None, overrides)
    cfg.model.arch = toy[0].arch
    with pytest.raises(ConfigError, match=message):
        validate_config(cfg, 2)


# The modules issue 28 (item 5) found branching on the family; they ask the workload now.
_ASKERS = ["validation.py", "config/checks.py", "data/checks.py", "data/__init__.py",
           "models/__init__.py"]
_ARCHS = set(get_args(ModelArch))


def _family_tests(tree: ast.AST) -> list[int]:
    """Lines that compare `….arch`, an arch's name or a family's list of sources (`*_SOURCES`),
    or key a table by arch names."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(
                (isinstance(n, ast.Attribute) and n.attr == "arch")
                or (isinstance(n, ast.Constant) and n.value in _ARCHS)
                or (isinstance(n, ast.Name) and n.id.endswith("_SOURCES")) for n in ast.walk(node)):
            lines.append(node.lineno)
        if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value in _ARCHS
                                              for k in node.keys):
            lines.append(node.lineno)
    return lines


def test_family_tests_live_in_the_workloads():
    found = {name: _family_tests(ast.parse((PACKAGE / name).read_text()))
             for name in _ASKERS}
    assert not any(found.values()), (
        f"branches on model.arch outside dlrmtrain/workloads/ (move them into the family's "
        f"Workload): {found}")


def test_the_family_test_finder_sees_a_branch():
    assert _family_tests(ast.parse("if cfg.model.arch == 'x':\n    pass\n")) == [1]
    assert _family_tests(ast.parse("b = {'dlrm_v1': 1}\n")) == [1]
    assert _family_tests(ast.parse("s = cfg.data.source in YAMBDA_SOURCES\n")) == [1]


def test_another_familys_source_is_refused_before_its_data_is_read(tmp_path):
    """resolve_config fills in only from a source of the model's family: DLRMv4 on `criteo`
    files is refused as the pairing it is, not for the Criteo dataset's missing metadata."""
    cfg = load_config(None, ["model.arch=dlrmv4_hstu", "data.source=criteo",
                             f"data.path={tmp_path / 'absent'}"])
    assert resolve_config(cfg).data.table_sizes is None
    with pytest.raises(ConfigError, match=r"data\.source: 'criteo' does not feed model\.arch "
                                          r"'dlrmv4_hstu' \(it reads synthetic_yambda or yambda\)"):
        validate_config(cfg, 2)


# Issue 35 (item 2): nothing outside the workloads (and the schema, which declares the
# arch names) reads model.arch or names a family; it asks the family's Workload.
_SCHEMA = PACKAGE / "config" / "schema.py"
_NAMES_ONLY_A_FAMILY = _ARCHS - set(BENCHMARKS)
"""Arch names that name nothing else: `dlrm_dcnv2` is also its MLPerf benchmark's name
(mllog's constant), which the MLPerf tooling keys its rules by."""


def _is_a_workload(node: ast.AST) -> bool:
    """`workload`, `….workload` or `workload_of(…)`: a Workload, whose `arch` is its own name."""
    if isinstance(node, ast.Call):
        node = node.func
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return name.startswith("workload") or name.endswith("workload")


def _family_reads(tree: ast.AST) -> list[int]:
    """Lines that read an `….arch` (cfg.model.arch, a saved config's ["arch"]) or name an
    arch; printing the config's value back in a message (an f-string field) is no read,
    nor is asking a Workload its own name."""
    shown = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.FormattedValue)}
    lines = set()
    for node in ast.walk(tree):
        if ((isinstance(node, ast.Attribute) and node.attr == "arch" and id(node) not in shown
             and not _is_a_workload(node.value))
                or (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                    and node.slice.value == "arch")
                or (isinstance(node, ast.Constant) and node.value in _NAMES_ONLY_A_FAMILY)):
            lines.add(node.lineno)
    return sorted(lines)


def test_nothing_outside_the_workloads_reads_model_arch_or_names_a_family():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == _SCHEMA or "workloads" in path.relative_to(PACKAGE).parts:
            continue
        lines = _family_reads(ast.parse(path.read_text()))
        if lines:
            found[str(path.relative_to(PACKAGE))] = lines
    assert not found, (f"model.arch read or a family named outside dlrmtrain/workloads/ (ask the "
                       f"family's Workload: dlrmtrain/workloads/base.py): {found}")


def test_the_family_read_finder_sees_a_read():
    assert _family_reads(ast.parse("if m.arch == 'x':\n    pass\n")) == [1]
    assert _family_reads(ast.parse("b = benchmark_for(cfg['model']['arch'])\n")) == [1]
    assert _family_reads(ast.parse("SCOPED = frozenset({'dlrmv4_hstu'})\n")) == [1]
    assert _family_reads(ast.parse("raise E(f'model.arch {cfg.model.arch!r} is refused')\n")) == []
    assert _family_reads(ast.parse("a = workload.arch\nb = workload_of(cfg).arch\n")) == []
    assert _family_reads(ast.parse("a = run.arch\n")) == [1]


def test_each_familys_sources_are_the_data_builders():
    """The workloads name their sources without importing the loaders; these are the data
    package's own (the builder a workload calls reads exactly these)."""
    from dlrmtrain.data.datasets import ROW_SOURCES, SEQUENCE_SOURCES

    assert registry.WORKLOADS["dlrm_v1"].sources == registry.WORKLOADS["dlrm_dcnv2"].sources == ROW_SOURCES
    assert registry.WORKLOADS["dlrmv4_hstu"].sources == SEQUENCE_SOURCES


def test_reading_a_familys_facts_imports_no_torch():
    """`dlrmtrain report` and the MLPerf runner ask a family its benchmark without torch."""
    code = ("import sys, dlrmtrain.workloads as w; "
            "print(w.workload_named('dlrmv4_hstu').benchmark, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=120, cwd=PACKAGE.parent).stdout.split()
    assert out == ["dlrmv4", "False"]
