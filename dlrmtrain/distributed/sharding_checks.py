"""The sharding config checked before any process group exists, torch-free (the CLI checks a
config without TorchRec): placements and planner choices the planners cannot honour, and which
tables take which sharding type and the UVM cache (planner.py builds the plan from these).
"""

from __future__ import annotations

from typing import Mapping

from dlrmtrain.config.loader import ConfigError
from dlrmtrain.config.schema import Config, ShardingConfig

UVM_CACHING = "fused_uvm_caching"
"""TorchRec's compute kernel of a table behind an HBM cache"""
NO_CPU_UVM = ("fbgemm's CPU build has no UVM kernel (its CPU lookup takes host tables only: "
              "\"ComputeDevice.CPU is only for EmbeddingLocation.HOST\"), and TorchRec offers "
              "fused_uvm_caching on CUDA only")


def table_sharding_types(cfg: ShardingConfig, tables: list[str]) -> dict[str, str]:
    return {t: cfg.tables.get(t, cfg.default_type) for t in tables}


def check_sharding_config(cfg: Config, world_size: int, device_type: str) -> None:
    """Raise ConfigError for a placement or planner choice the planners cannot honour."""
    sharding = cfg.sharding
    for table, rank in sharding.table_ranks.items():
        if not 0 <= rank < world_size:
            raise ConfigError(f"sharding.table_ranks.{table}: rank {rank} is outside the world "
                              f"of {world_size} ranks")
        if sharding.tables.get(table, sharding.default_type) != "table_wise":
            raise ConfigError(f"sharding.table_ranks.{table}: only table-wise tables have one rank")
        if sharding.planner != "manual":
            raise ConfigError(f"sharding.table_ranks.{table}: placements are set by hand only "
                              f"with sharding.planner=manual")
    wanted = set(sharding.tables.values()) | {sharding.default_type}
    if sharding.planner == "torchrec" and device_type != "cuda" and "row_wise" in wanted:
        raise ConfigError("sharding.planner: TorchRec's planner offers no row-wise sharding "
                          "on CPU; use sharding.planner=manual for row-wise tables")
    _check_uvm_caching(sharding, device_type)


def _check_uvm_caching(sharding: ShardingConfig, device_type: str) -> None:
    uvm = sharding.uvm_caching
    key = "sharding.uvm_caching." + ("tables" if uvm.tables else "min_rows")
    if (uvm.tables or uvm.min_rows is not None) and device_type != "cuda":
        raise ConfigError(f"{key}: fused_uvm_caching runs on CUDA only: {NO_CPU_UVM}; "
                          f"remove it, or use run.device=cuda")
    if not 0.0 < uvm.load_factor <= 1.0:
        raise ConfigError(f"sharding.uvm_caching.load_factor: must be in (0, 1], got {uvm.load_factor}")
    if uvm.min_rows is not None and uvm.min_rows < 1:
        raise ConfigError(f"sharding.uvm_caching.min_rows: must be at least 1, got {uvm.min_rows}")
    for table in uvm.tables:
        if sharding.tables.get(table, sharding.default_type) == "data_parallel":
            raise ConfigError(f"sharding.uvm_caching.tables: {table} is data_parallel (replicated, "
                              f"updated densely): only a sharded table can be UVM-cached")


def uvm_cached_tables(sharding: ShardingConfig, rows: Mapping[str, int]) -> list[str]:
    """The tables of `rows` (table → rows) looked up through fused_uvm_caching: those named,
    and those of at least `min_rows` rows; a data-parallel one caught by `min_rows` is refused."""
    uvm = sharding.uvm_caching
    cached = [t for t in rows if t in uvm.tables or (uvm.min_rows is not None and rows[t] >= uvm.min_rows)]
    replicated = [t for t in cached if sharding.tables.get(t, sharding.default_type) == "data_parallel"]
    if replicated:
        raise ConfigError(f"sharding.uvm_caching.min_rows: {uvm.min_rows:,} takes the data_parallel "
                          f"table {replicated[0]} ({rows[replicated[0]]:,} rows), which cannot be "
                          f"UVM-cached; raise it, or shard {replicated[0]}")
    return cached
