"""The sharding plan: which rank holds which table (or which slice of it).

Built by hand from the config rather than by TorchRec's planner: the plan is
then explicit and the same on every machine, and row-wise works on CPU (the
planner refuses it there). Table-wise tables go, largest first, to the rank
with the fewest bytes so far. Sharded tables use the `fused` kernel so the
optimizer runs inside the backward pass; data-parallel tables are replicated.
"""

from __future__ import annotations

from torchrec.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    row_wise,
    table_wise,
)
from torchrec.distributed.types import ModuleSharder, ShardingPlan
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from dlrmtrain.config.schema import ShardingConfig

# Where DLRMTrain keeps its EmbeddingBagCollection.
EBC_PATH = "model.sparse_arch.embedding_bag_collection"
FUSED = "fused"


def table_sharding_types(cfg: ShardingConfig, tables: list[str]) -> dict[str, str]:
    return {t: cfg.tables.get(t, cfg.default_type) for t in tables}


def build_sharding_plan(ebc: EmbeddingBagCollection, cfg: ShardingConfig, world_size: int,
                        device_type: str, sharder: ModuleSharder) -> ShardingPlan:
    configs = {c.name: c for c in ebc.embedding_bag_configs()}
    kinds = table_sharding_types(cfg, list(configs))
    load = [0] * world_size
    generators = {}
    # Largest tables first so the greedy placement balances memory.
    for name in sorted(configs, key=lambda n: -configs[n].num_embeddings):
        kind = kinds[name]
        if kind == "table_wise":
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
    return ShardingPlan({EBC_PATH: module_plan})


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
