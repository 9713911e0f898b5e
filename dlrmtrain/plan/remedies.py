"""What would fit when a config does not, one knob at a time, each counted as the run's own
memory check counts (run/machine.py: the tables spread evenly over the GPUs, the dense state,
the activations at the local batch): more GPUs at the same global batch, a smaller local
batch, TorchRec's `fused_uvm_caching` for the largest tables (sharding.uvm_caching)."""

from __future__ import annotations

import copy
from typing import Optional

from dlrmtrain.config.schema import Config
from dlrmtrain.distributed.planner import Cluster
from dlrmtrain.distributed.sharding_checks import table_sharding_types, uvm_cached_tables
from dlrmtrain.models.activation_memory import FP32, gib
from dlrmtrain.plan.sizing import Sizing
from dlrmtrain.run.machine import table_part


def even_tables(sizing: Sizing, cfg: Config, gpus: int) -> int:
    """Each GPU's share of the tables and their optimizer state spread evenly (UVM-cached ones
    by their cache), as the memory check counts it."""
    lf = cfg.sharding.uvm_caching.load_factor
    cached = {t: lf for t in uvm_cached_tables(cfg.sharding, sizing.rows)}
    return table_part(sizing.rows, sizing.widths, sizing.table_state, gpus,
                      sizing.workload.shrink_tables, cached).nbytes


def even_need(sizing: Sizing, cfg: Config, gpus: int, local_batch: int) -> int:
    """What each of `gpus` GPUs needs at `local_batch` samples: its even share of the tables,
    the dense state, the activations."""
    return even_tables(sizing, cfg, gpus) + sizing.dense_bytes + sizing.activations(cfg, local_batch).peak


def more_gpus(sizing: Sizing, cfg: Config, cluster: Cluster) -> str:
    """The fewest GPUs of this size that hold the run at its global batch (a divisor of it)."""
    global_batch = cfg.run.global_batch_size
    for gpus in range(cluster.gpus + 1, global_batch + 1):
        if global_batch % gpus == 0 and even_need(sizing, cfg, gpus, global_batch // gpus) <= cluster.hbm_bytes:
            return (f"more GPUs: {gpus} × {gib(cluster.hbm_bytes)} at run.global_batch_size {global_batch:,} "
                    f"(local batch {global_batch // gpus:,})")
    one = even_need(sizing, cfg, global_batch, 1)
    return (f"more GPUs: none: even {global_batch:,} GPUs, one sample each, need {gib(one)} each "
            f"at run.global_batch_size {global_batch:,}")


def largest_local_batch(sizing: Sizing, cfg: Config, fixed: int, hbm: int, upto: int) -> int:
    """The largest local batch ≤ `upto` whose activations fit beside `fixed` bytes (0: none)."""
    low, high = 0, upto
    while low < high:  # the activations grow with the batch
        mid = (low + high + 1) // 2
        if fixed + sizing.activations(cfg, mid).peak <= hbm:
            low = mid
        else:
            high = mid - 1
    return low


def smaller_batch(sizing: Sizing, cfg: Config, cluster: Cluster, tables_on_largest: int) -> str:
    """The largest local batch that fits beside the tables' largest share (`tables_on_largest`)."""
    local = cfg.run.global_batch_size // cluster.gpus
    fixed = tables_on_largest + sizing.dense_bytes
    batch = largest_local_batch(sizing, cfg, fixed, cluster.hbm_bytes, local - 1)
    if batch == 0:
        return (f"a smaller local batch: none: the tables and dense state alone take {gib(fixed)} "
                f"of a GPU's {gib(cluster.hbm_bytes)}, one sample's activations "
                f"{gib(sizing.activations(cfg, 1).peak)}")
    return (f"a smaller local batch: {batch:,} per GPU (run.global_batch_size={batch * cluster.gpus:,}), "
            f"{gib(fixed + sizing.activations(cfg, batch).peak)} of {gib(cluster.hbm_bytes)}")


def uvm_caching(sizing: Sizing, cfg: Config, cluster: Cluster) -> str:
    """Cache the largest sharded tables (largest first) until the run fits at its local batch,
    or, all of them cached, the largest local batch that then fits."""
    kinds = table_sharding_types(cfg.sharding, list(sizing.rows))
    sharded = sorted((t for t in sizing.rows if kinds[t] != "data_parallel"), key=lambda t: -sizing.rows[t])
    local = cfg.run.global_batch_size // cluster.gpus
    cached_cfg = cfg
    for count in range(1, len(sharded) + 1):
        cached_cfg = with_uvm_tables(cfg, sharded[:count])
        if even_need(sizing, cached_cfg, cluster.gpus, local) <= cluster.hbm_bytes:
            return _uvm_line(sizing, cached_cfg, cluster, sharded[:count], local, fits=True)
    fixed = even_tables(sizing, cached_cfg, cluster.gpus) + sizing.dense_bytes
    batch = largest_local_batch(sizing, cached_cfg, fixed, cluster.hbm_bytes, local - 1)
    return _uvm_line(sizing, cached_cfg, cluster, sharded, batch, fits=False)


def with_uvm_tables(cfg: Config, tables: list[str]) -> Config:
    """A copy of `cfg` whose `tables` (and only those) are UVM-cached."""
    cached = copy.deepcopy(cfg)
    cached.sharding.uvm_caching.tables, cached.sharding.uvm_caching.min_rows = list(tables), None
    return cached


def _uvm_line(sizing: Sizing, cfg: Config, cluster: Cluster, tables: list[str], batch: int, fits: bool) -> str:
    """The UVM remedy: which tables, the key that caches them, what a GPU and its host then hold."""
    uvm = cfg.sharding.uvm_caching
    kinds = table_sharding_types(cfg.sharding, list(sizing.rows))
    which = (f"all {len(tables)} sharded tables" if len(tables) == sum(k != "data_parallel" for k in kinds.values())
             else f"the {len(tables)} largest table{'s' * (len(tables) > 1)}")
    smallest = min(sizing.rows[t] for t in tables)
    caught = [t for t in sizing.rows if sizing.rows[t] >= smallest]
    key = (f"sharding.uvm_caching.min_rows={smallest}" if sorted(caught) == sorted(tables)
           else f"sharding.uvm_caching.tables=[{','.join(tables)}]")
    host = sum(sizing.rows[t] * sizing.widths[t] * FP32 for t in tables) / cluster.gpus
    host_note = (f"{gib(host)} of host memory per GPU" if host <= cluster.host_bytes else
                 f"{gib(host)} of host memory per GPU, more than its {gib(cluster.host_bytes)}: not enough")
    what = f"fused_uvm_caching for {which} ({key}, load factor {uvm.load_factor:g})"
    if fits:
        return f"{what}: {gib(even_need(sizing, cfg, cluster.gpus, batch))} per GPU at local batch {batch:,}; {host_note}"
    if batch == 0:
        return f"{what}: not enough: the tables' caches and dense state alone leave no room for one sample"
    return (f"{what} and a local batch of {batch:,} (run.global_batch_size={batch * cluster.gpus:,}): "
            f"{gib(even_need(sizing, cfg, cluster.gpus, batch))} per GPU; {host_note}")


def remedies(sizing: Sizing, cfg: Config, cluster: Cluster, tables_on_largest: Optional[int]) -> list[str]:
    """Each knob's answer, one line each; `tables_on_largest`: the planned largest rank's tables
    and optimizer state (None: no plan; the even spread stands in)."""
    if tables_on_largest is None:
        tables_on_largest = even_tables(sizing, cfg, cluster.gpus)
    return [more_gpus(sizing, cfg, cluster), smaller_batch(sizing, cfg, cluster, tables_on_largest),
            uvm_caching(sizing, cfg, cluster)]
