"""`model.arch` → its Workload: the families dlrmtrain runs, registered by name.

A new family: its file in this package, its workload in `_SHIPPED` below, and its
`model.arch` (and any new `data.source`) in config/schema.py's Literal, which the
loader checks (tests/config/test_workloads.py holds the three together).
"""

from __future__ import annotations

from typing import Any, Mapping

from dlrmtrain.config.loader import ConfigError
from dlrmtrain.config.schema import Config
from dlrmtrain.workloads.base import Workload
from dlrmtrain.workloads.dlrm import DLRM_DCNV2, DLRM_V1
from dlrmtrain.workloads.dlrmv4 import DLRMV4

WORKLOADS: dict[str, Workload] = {}
"""model.arch → workload, filled by `register`."""


def register(workload: Workload) -> None:
    """Make `workload` the one validation and the builders ask for its `model.arch`."""
    if workload.arch in WORKLOADS:
        raise ValueError(f"model.arch {workload.arch!r} has a workload already")
    WORKLOADS[workload.arch] = workload


_SHIPPED = (DLRM_V1, DLRM_DCNV2, DLRMV4)
for _workload in _SHIPPED:
    register(_workload)


def workload_of(cfg: Config) -> Workload:
    """The workload of `cfg.model.arch`; ConfigError naming the key when none is registered."""
    try:
        return WORKLOADS[cfg.model.arch]
    except KeyError:
        raise ConfigError(f"model.arch: {cfg.model.arch!r} is not one of "
                          f"{', '.join(WORKLOADS)}") from None


def workload_named(arch: str) -> Workload:
    """The workload of `model.arch` value `arch` (a script's or a record's); ValueError
    naming the known ones when none is registered."""
    try:
        return WORKLOADS[arch]
    except KeyError:
        raise ValueError(f"model.arch {arch!r} has no workload; known: {', '.join(WORKLOADS)}") from None


def workload_of_saved(saved: Mapping[str, Any]) -> Workload:
    """The workload of a config as a run saved it (its config.yaml, read as a dict)."""
    return workload_named(saved["model"]["arch"])
