"""The sharding plan: which rank holds which table (or which slice of it).

Two ways, chosen by `sharding.planner`:
- `manual` (default): built from the config's per-table choices, the same on
  every machine; row-wise works on CPU (TorchRec's planner refuses it there).
  Table-wise tables go where `table_ranks` says, else, largest first, to the
  rank holding the fewest rows so far.
- `torchrec`: TorchRec's EmbeddingShardingPlanner, constrained to the same
  per-table sharding types, planned on rank 0 and broadcast.
Sharded tables use the `fused` kernel so the optimizer runs inside the
backward pass, or on CUDA `fused_uvm_caching` for the tables `sharding.uvm_caching`
names (host memory behind an HBM cache of `load_factor` of their rows, the same
fused optimizer); data-parallel tables are replicated and updated densely.
`plan_on_cluster` asks TorchRec's planner for a cluster that need not exist (a
topology of N GPUs of M GB): `dlrmtrain plan`.
The same plans serve DLRM's EmbeddingBagCollection (at EBC_PATH) and DLRMv4's
sequence EmbeddingCollection (`build_sharding_plan(..., module_path=...)`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
import torch.distributed as dist
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import (
    HardwareConfig, KernelConfig, TopologyFactory, TrainerConfig)
from torchrec.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    row_wise,
    table_wise,
)
from torchrec.distributed.types import CacheParams, ModuleSharder, ShardingPlan
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from dlrmtrain.config.schema import ShardingConfig
from dlrmtrain.distributed.sharding_checks import UVM_CACHING, table_sharding_types, uvm_cached_tables

# Where DLRMTrain keeps its EmbeddingBagCollection.
EBC_PATH = "model.sparse_arch.embedding_bag_collection"
FUSED = "fused"
def _table_kernels(cfg: ShardingConfig, rows: Mapping[str, int]) -> dict[str, tuple[str, str]]:
    """Table → (sharding type, compute kernel), in `rows`' order."""
    kinds = table_sharding_types(cfg, list(rows))
    cached = set(uvm_cached_tables(cfg, rows))
    return {t: (kind, "dense" if kind == "data_parallel" else UVM_CACHING if t in cached else FUSED)
            for t, kind in kinds.items()}


def _constraints(cfg: ShardingConfig, rows: Mapping[str, int]) -> dict[str, ParameterConstraints]:
    """TorchRec planner constraints: each table's sharding type and kernel, and a cached table's
    cache load factor."""
    cache = CacheParams(load_factor=cfg.uvm_caching.load_factor)
    return {name: ParameterConstraints(sharding_types=[kind], compute_kernels=[kernel],
                                       cache_params=cache if kernel == UVM_CACHING else None)
            for name, (kind, kernel) in _table_kernels(cfg, rows).items()}


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
    rows = {c.name: c.num_embeddings for c in _table_configs(ebc)}
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world_size, compute_device=device_type,
                          local_world_size=world_size),
        constraints=_constraints(cfg, rows))
    if dist.is_initialized():
        return planner.collective_plan(model, [sharder], dist.GroupMember.WORLD)
    return planner.plan(model, [sharder])


def _manual_plan(ebc: EmbeddingBagCollection | EmbeddingCollection, cfg: ShardingConfig, world_size: int,
                 device_type: str, sharder: ModuleSharder, module_path: str = EBC_PATH) -> ShardingPlan:
    configs = {c.name: c for c in _table_configs(ebc)}
    kernels = _table_kernels(cfg, {name: c.num_embeddings for name, c in configs.items()})
    load = [0] * world_size
    for name, rank in cfg.table_ranks.items():
        load[rank] += configs[name].num_embeddings
    generators = {}
    # Largest tables first so the greedy placement balances memory.
    for name in sorted(configs, key=lambda n: -configs[n].num_embeddings):
        kind, kernel = kernels[name]
        if kind == "table_wise" and name in cfg.table_ranks:
            generators[name] = table_wise(rank=cfg.table_ranks[name], compute_kernel=kernel)
        elif kind == "table_wise":
            rank = min(range(world_size), key=lambda r: (load[r], r))
            load[rank] += configs[name].num_embeddings
            generators[name] = table_wise(rank=rank, compute_kernel=kernel)
        elif kind == "column_wise":
            generators[name] = column_wise(ranks=list(range(world_size)), compute_kernel=kernel)
        elif kind == "row_wise":
            generators[name] = row_wise(compute_kernel=kernel)
        elif kind == "data_parallel":
            generators[name] = data_parallel()
        else:
            raise ValueError(f"sharding.tables.{name}: unknown sharding type {kind!r}")
    module_plan = construct_module_sharding_plan(
        ebc, generators, sharder=sharder, local_size=world_size, world_size=world_size,
        device_type=device_type)
    for name, (_kind, kernel) in kernels.items():  # the cache's size travels on the plan, as the planner's does
        if kernel == UVM_CACHING:
            module_plan[name].cache_params = CacheParams(load_factor=cfg.uvm_caching.load_factor)
    return ShardingPlan({module_path: module_plan})


@dataclass(frozen=True)
class Cluster:
    """GPUs to plan for, which need not be this machine's."""

    gpus: int
    gpus_per_node: int
    hbm_bytes: int
    """Each GPU's memory."""
    host_bytes: int
    """Host memory per GPU (where UVM-cached tables live)."""


def plan_on_cluster(model: torch.nn.Module, module_path: str, cfg: ShardingConfig, sharder: ModuleSharder,
                    cluster: Cluster, reserved_bytes: int, batch_size: int) -> ShardingPlan:
    """TorchRec's planner's plan for the embedding module at `module_path` (on meta: nothing is
    allocated) on `cluster`, within the config's sharding types and kernels, with
    `reserved_bytes` of every GPU kept for what is not a table (dense state, activations).
    Raises PlannerError when the tables do not fit beside it."""
    rows = {c.name: c.num_embeddings for c in _table_configs(model.get_submodule(module_path))}
    topology = TopologyFactory.create_topology(
        trainer_config=TrainerConfig(world_size=cluster.gpus, local_world_size=cluster.gpus_per_node,
                                     hbm_cap_bytes=cluster.hbm_bytes, ddr_cap_bytes=cluster.host_bytes),
        hardware_config=HardwareConfig(), kernel_config=KernelConfig(compute_device="cuda"))
    reserved = min(1.0, reserved_bytes / cluster.hbm_bytes)
    planner = EmbeddingShardingPlanner(
        topology=topology, constraints=_constraints(cfg, rows), batch_size=batch_size,
        storage_reservation=FixedPercentageStorageReservation(reserved))
    return planner.plan(model, [sharder])


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
