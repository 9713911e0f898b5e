"""The sharding plan: which rank holds which table (or which slice of it).

Two ways, chosen by `sharding.planner`:
- `manual` (default): built from the config's per-table choices, the same on
  every machine; row-wise works on CPU (TorchRec's planner refuses it there).
  Table-wise tables go where `table_ranks` says, else, largest first, to the
  rank holding the fewest rows so far.
- `torchrec`: TorchRec's EmbeddingShardingPlanner, constrained to the same
  per-table sharding types, planned on rank 0 and broadcast.
Sharded tables use the `fused` kernel so the optimizer runs inside the
backward pass; data-parallel tables are replicated and updated densely.
The same plans serve DLRM's EmbeddingBagCollection (at EBC_PATH) and DLRMv4's
sequence EmbeddingCollection (`build_sharding_plan(..., module_path=...)`).
"""

from __future__ import annotations

import torch

import torch.distributed as dist
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    row_wise,
    table_wise,
)
from torchrec.distributed.types import ModuleSharder, ShardingPlan
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from dlrmtrain.config.loader import ConfigError
from dlrmtrain.config.schema import Config, ShardingConfig

# Where DLRMTrain keeps its EmbeddingBagCollection.
EBC_PATH = "model.sparse_arch.embedding_bag_collection"
FUSED = "fused"


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


def build_sharding_plan(model: torch.nn.Module, cfg: ShardingConfig, world_size: int,
                        device_type: str, sharder: ModuleSharder, module_path: str = EBC_PATH) -> ShardingPlan:
    """The plan for the embedding module at `module_path` of `model` (DLRM: its EBC at EBC_PATH;
    DLRMv4: its EmbeddingCollection, sharded with an EC sharder)."""
    ebc = model.get_submodule(module_path)
    if cfg.planner == "torchrec":
        return _torchrec_plan(model, ebc, cfg, world_size, device_type, sharder)
    return _manual_plan(ebc, cfg, world_size, device_type, sharder, module_path)


def _table_configs(module: EmbeddingBagCollection | EmbeddingCollection) -> list:
    """The table configs of an EBC or an EC."""
    if isinstance(module, EmbeddingCollection):
        return module.embedding_configs()
    return module.embedding_bag_configs()


def _torchrec_plan(model: torch.nn.Module, ebc: EmbeddingBagCollection | EmbeddingCollection,
                   cfg: ShardingConfig, world_size: int, device_type: str,
                   sharder: ModuleSharder) -> ShardingPlan:
    kinds = table_sharding_types(cfg, [c.name for c in _table_configs(ebc)])
    constraints = {
        name: ParameterConstraints(
            sharding_types=[kind],
            compute_kernels=["dense"] if kind == "data_parallel" else [FUSED])
        for name, kind in kinds.items()}
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world_size, compute_device=device_type,
                          local_world_size=world_size),
        constraints=constraints)
    if dist.is_initialized():
        return planner.collective_plan(model, [sharder], dist.GroupMember.WORLD)
    return planner.plan(model, [sharder])


def _manual_plan(ebc: EmbeddingBagCollection | EmbeddingCollection, cfg: ShardingConfig, world_size: int,
                 device_type: str, sharder: ModuleSharder, module_path: str = EBC_PATH) -> ShardingPlan:
    configs = {c.name: c for c in _table_configs(ebc)}
    kinds = table_sharding_types(cfg, list(configs))
    load = [0] * world_size
    for name, rank in cfg.table_ranks.items():
        load[rank] += configs[name].num_embeddings
    generators = {}
    # Largest tables first so the greedy placement balances memory.
    for name in sorted(configs, key=lambda n: -configs[n].num_embeddings):
        kind = kinds[name]
        if kind == "table_wise" and name in cfg.table_ranks:
            generators[name] = table_wise(rank=cfg.table_ranks[name], compute_kernel=FUSED)
        elif kind == "table_wise":
            rank = min(range(world_size), key=lambda r: (load[r], r))
            load[rank] += configs[name].num_embeddings
            generators[name] = table_wise(rank=rank, compute_kernel=FUSED)
        elif kind == "column_wise":
            generators[name] = column_wise(ranks=list(range(world_size)), compute_kernel=FUSED)
        elif kind == "row_wise":
            generators[name] = row_wise(compute_kernel=FUSED)
        elif kind == "data_parallel":
            generators[name] = data_parallel()
        else:
            raise ValueError(f"sharding.tables.{name}: unknown sharding type {kind!r}")
    module_plan = construct_module_sharding_plan(
        ebc, generators, sharder=sharder, local_size=world_size, world_size=world_size,
        device_type=device_type)
    return ShardingPlan({module_path: module_plan})


def describe_plan(plan: ShardingPlan) -> str:
    """One line per table: sharding type, kernel and the ranks holding it."""
    lines = ["sharding plan:"]
    for path, module_plan in plan.plan.items():
        for table, ps in sorted(module_plan.items(),
                                key=lambda kv: int(kv[0].rsplit("_", 1)[-1])
                                if kv[0].rsplit("_", 1)[-1].isdigit() else kv[0]):
            ranks = sorted(set(ps.ranks)) if ps.ranks else "all"
            lines.append(f"  {table:<10} {ps.sharding_type:<14} {ps.compute_kernel:<6} ranks {ranks}")
    return "\n".join(lines)


def _table_order(name: str):
    tail = name.rsplit("_", 1)[-1]
    return (0, int(tail)) if tail.isdigit() else (1, name)


def summarize_plan(plan: ShardingPlan, rows: dict[str, int], dim: int, top: int = 3) -> list[str]:
    """The plan in a few lines: one per sharding type (tables and where they live),
    one per rank (tables and bytes it holds), and the largest tables. `rows`: table →
    rows; bytes are fp32 weights (rows × `dim` × 4), a row-wise or column-wise table's
    bytes split evenly over its ranks."""
    by_type: dict[str, list[str]] = {}
    per_rank: dict[int, list[float]] = {}  # rank -> [tables, bytes]
    placed: dict[str, str] = {}
    for module_plan in plan.plan.values():
        for table, ps in module_plan.items():
            by_type.setdefault(ps.sharding_type, []).append(table)
            ranks = sorted(set(ps.ranks)) if ps.ranks else []
            placed[table] = (f"rank {ranks[0]}" if len(ranks) == 1
                             else f"ranks {ranks[0]}-{ranks[-1]}" if ranks else "every rank")
            weight_bytes = rows.get(table, 0) * dim * 4
            for r in ranks:
                entry = per_rank.setdefault(r, [0, 0.0])
                entry[0] += 1
                entry[1] += weight_bytes / len(ranks)
    lines = []
    for kind, tables in sorted(by_type.items()):
        total_rows = sum(rows.get(t, 0) for t in tables)
        lines.append(f"  {kind:<13} {len(tables):>3} tables  {total_rows:>12,} rows")
    for rank, (count, nbytes) in sorted(per_rank.items()):
        lines.append(f"  rank {rank:<8} {count:>3} tables  {nbytes / 2**20:>9.2f} MiB of weights")
    largest = sorted(rows, key=lambda t: (-rows[t], _table_order(t)))[:top]
    lines.append("  largest: " + ", ".join(
        f"{t} {rows[t]:,} rows ({placed.get(t, '?')})" for t in largest))
    return lines
