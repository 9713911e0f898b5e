"""A loaded Config made ready to run: `resolve_config` fills in what comes from the
dataset; `validate_config` checks everything, in order, and changes nothing. Both
run before any process group exists (and again in every rank, on the same files).

    cfg = resolve_config(load_config(path, overrides))
    validate_config(cfg, world_size)
    Trainer(cfg, env)      # refuses a config that is not resolved

Each package owns the rules it knows (config: sizes, ranges, table names; data: the
tables against the feature layout and the source settings; distributed: placements
and planner limits; comm: the codec choice), and what differs per model family is
its workload's (dlrmtrain/workloads/: which sources feed it, which checks apply,
what it refuses). This module only calls them: config/ sits below those packages
and must not import them.

The checks read what codecs declare (comm/declarations.py), never their torch
implementations: `dlrmtrain train` runs them in the launching process, before the
ranks start, without importing TorchRec or fbgemm (tests/test_validation_imports.py).
"""

from __future__ import annotations

import copy

from dlrmtrain.comm import placement_choice
from dlrmtrain.comm.codec_choice import validate_codec_choice, validate_hierarchy, validate_wire_precision
from dlrmtrain.comm.declarations import available_codecs
from dlrmtrain.comm.topology import Hierarchy, check_ranks_per_node, ranks_per_node
from dlrmtrain.config import checks
from dlrmtrain.config.loader import ConfigError
from dlrmtrain.config.schema import Config
from dlrmtrain.distributed.sharding_checks import check_sharding_config
from dlrmtrain.workloads import Workload, workload_of


def resolved_device_type(cfg: Config) -> str:
    """`cpu` or `cuda`: run.device with `auto` resolved on this machine."""
    if cfg.run.device != "auto":
        return cfg.run.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _check_hierarchy(cfg: Config, world_size: int, workload: Workload) -> None:
    """comm.hierarchy: node takes the family's pooled all-to-alls only, under dedup (and
    per-table none), and whole nodes."""
    comm = cfg.comm
    try:
        validate_hierarchy(Hierarchy.of(comm), comm.codec, comm.table_codecs, workload.collection_kind)
        if comm.hierarchy == "node":
            check_ranks_per_node(ranks_per_node(comm.ranks_per_node, world_size), world_size)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _check_codecs(cfg: Config, device_type: str) -> None:
    codecs = available_codecs()
    for key, codec in [("comm.codec", cfg.comm.codec),
                       *((f"comm.table_codecs.{t}", c) for t, c in cfg.comm.table_codecs.items())]:
        if codec not in codecs:
            raise ConfigError(f"{key}: {codec!r} is not one of {', '.join(codecs)}")
    try:  # qcomms apply run-wide; fp8 has GPU kernels only (the error names comm.codec)
        validate_codec_choice(cfg.comm.codec, cfg.comm.table_codecs, device_type)
        validate_wire_precision(cfg.comm.codec, cfg.comm.table_codecs, workload_of(cfg).table_precision(cfg))
        # where the codec runs: an explicit side the family's path cannot take is refused
        placement_choice.check(cfg.comm, workload_of(cfg).collection_kind, cfg.optim.name)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def resolved_pipeline(cfg: Config, device_type: str) -> str:
    """run.pipeline with `auto` resolved for a run on `device_type`, as the model's
    workload says (Workload.default_pipeline). Any other value stays as given, checked
    by `_check_pipeline`."""
    if cfg.run.pipeline != "auto":
        return cfg.run.pipeline
    return workload_of(cfg).default_pipeline(device_type)


def _check_pipeline(cfg: Config, device_type: str) -> None:
    """run.pipeline: every choice trains the plain loop's numbers; refuse where that is
    not known to hold (schema.PipelineMode refuses the stale semi_sync outright)."""
    mode = cfg.run.pipeline
    if mode == "off":
        return
    if mode == "fused_sparse_dist" and device_type != "cpu":
        raise ConfigError(
            "run.pipeline: fused_sparse_dist runs on CPU only: on a GPU TorchRec looks the next "
            "batch up on a side stream that is not ordered after this step's updates "
            "(data-parallel tables and the fused update of the last backward could be read "
            "stale), and dlrmtrain's same-numbers check of it has only run on CPU; use "
            "run.pipeline=sparse_dist")


def resolve_config(cfg: Config) -> Config:
    """A copy of `cfg` with what comes from the data filled in (DLRM: null table sizes and
    bag sizes from the dataset's metadata, or the synthetic profile's), run.pipeline's
    `auto` resolved for this machine's device and an unset placement (where the codec runs)
    resolved (`resolved_placement`); raises ConfigError when the data and the
    config disagree. `cfg` itself is unchanged."""
    resolved = copy.deepcopy(cfg)
    resolved.run.pipeline = resolved_pipeline(cfg, resolved_device_type(cfg))
    workload = workload_of(cfg)
    if cfg.data.source in workload.sources:  # another family's source: validate_config refuses it
        workload.resolve(resolved)
    if placement_choice.unresolved(resolved.comm):  # after the tables: their plan is part of the choice
        placement_choice.set_value(resolved.comm, resolved_placement(resolved)[0])
    return resolved


def resolved_placement(cfg: Config) -> tuple[str, str | None]:
    """What an unset placement becomes on `cfg` (its other keys resolved), and why when it is
    the owner for a reason (comm/placement_choice.py's `resolve`; its own value is not read)."""
    workload = workload_of(cfg)
    return placement_choice.resolve(cfg.comm, workload.collection_kind, cfg.optim.name,
                             lambda: _row_wise_tables(cfg, workload))


def placement_note(loaded: Config, resolved: Config) -> str | None:
    """The line a run prints when its placement was left unset (`loaded`) and resolved to the
    owner for a reason (comm/placement_choice.py's `note`); else None."""
    if not placement_choice.unresolved(loaded.comm):
        return None
    return placement_choice.note(*resolved_placement(resolved))


def start_notes(loaded: Config, resolved: Config, rank: int) -> list[str]:
    """The lines a run prints once at start: its placement left unset and kept at the owner
    (`placement_note`), and bf16 that this CPU would emulate (precision.py; only rank 0, the
    rank that prints, pays for the measurement it quotes)."""
    notes = [placement_note(loaded, resolved)]
    if rank == 0:
        from dlrmtrain.precision import emulated_bf16_note  # torch and fbgemm: a rank's start only

        notes.append(emulated_bf16_note(resolved.precision.mode, resolved_device_type(resolved)))
    return [note for note in notes if note]


def _row_wise_tables(cfg: Config, workload: Workload) -> tuple[int, int]:
    """(row-wise tables, tables that cross the all-to-all) of the config's plan; (0, 0) while
    the tables are unknown (a config validate_config refuses)."""
    try:
        names = workload.table_names(cfg)
    except (TypeError, ValueError):
        return 0, 0
    types = [cfg.sharding.tables.get(n, cfg.sharding.default_type) for n in names]
    crossing = [t for t in types if t != "data_parallel"]
    return sum(t == "row_wise" for t in crossing), len(crossing)


def unresolved_keys(cfg: Config) -> list[str]:
    """Keys still null that `resolve_config` fills in (empty for a resolved config)."""
    return workload_of(cfg).unresolved_keys(cfg) + placement_choice.unresolved(cfg.comm)


def _check_data(cfg: Config, world_size: int, workload: Workload) -> None:
    """The data section: a source of the model's family, then that family's data rules."""
    if cfg.data.source not in workload.sources:
        raise ConfigError(f"data.source: {cfg.data.source!r} does not feed model.arch "
                          f"{cfg.model.arch!r} (it reads {' or '.join(workload.sources)})")
    workload.check_data(cfg, world_size)


def validate_config(cfg: Config, world_size: int) -> None:
    """Raise ConfigError naming the key for any impossible combination. Pure: `cfg`
    is not changed; it is checked as `resolve_config` makes it (so sizes that
    disagree with the dataset's are refused here too)."""
    cfg = resolve_config(cfg)
    device_type = resolved_device_type(cfg)
    workload = workload_of(cfg)
    checks.check_run(cfg, world_size)
    _check_data(cfg, world_size, workload)
    checks.check_model(cfg)
    workload.check_model(cfg)
    workload.check_device(cfg, device_type)
    workload.check_pipeline(cfg)
    _check_pipeline(cfg, device_type)
    checks.check_table_keys(cfg, workload.table_names(cfg))
    check_sharding_config(cfg, world_size, device_type)
    workload.check_sharding(cfg)
    _check_codecs(cfg, device_type)
    checks.check_comm_auto(cfg, workload.collection_kind)
    workload.check_hierarchy(cfg)
    _check_hierarchy(cfg, world_size, workload)
    checks.check_schedule_and_outputs(cfg)
