"""A config's memory on a cluster, rank by rank: its tables as TorchRec's planner places them
(distributed/planner.plan_on_cluster), its dense state and its activations (the family's
model of them, models/*activations.py), counted as the memory check counts them
(run/machine.py); nothing is allocated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torchrec.distributed.planner.types import PlannerError
from torchrec.distributed.types import ParameterSharding, ShardingPlan

from dlrmtrain.config.schema import Config
from dlrmtrain.distributed.planner import Cluster, plan_on_cluster
from dlrmtrain.distributed.sharding_checks import UVM_CACHING
from dlrmtrain.models.activation_memory import FP32, ActivationMemory
from dlrmtrain.optim.state_size import dense_optimizer_state, table_optimizer_state
from dlrmtrain.run.machine import dense_part
from dlrmtrain.workloads import Workload, workload_of


@dataclass(frozen=True)
class RankMemory:
    """One GPU's memory by part (bytes), and the host memory its UVM-cached tables take."""

    rank: int
    tables: int
    """On the GPU: its shards' fp32 weights, or a UVM-cached table's cache of them."""
    optimizer: int
    """On the GPU: the fused optimizer's state of its shards (and a replicated table's gradient
    and dense optimizer state)."""
    dense: int
    activations: int
    host: int
    """Host memory: the UVM-cached shards' rows (and a per-weight optimizer state)."""
    table_names: tuple[str, ...]

    @property
    def gpu(self) -> int:
        return self.tables + self.optimizer + self.dense + self.activations


class Sizing:
    """What does not change with the cluster: the config's family, tables and dense state."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.workload: Workload = workload_of(cfg)
        self.rows = self.workload.planned_table_rows(cfg)
        self.widths = self.workload.table_widths(cfg, self.rows)
        self.table_state = table_optimizer_state(cfg.optim)
        self.dense_state = dense_optimizer_state(cfg.optim)
        self.dense_parameters = self.workload.dense_parameters(cfg, self.rows)
        self.dense_bytes = dense_part(self.dense_parameters, self.dense_state).nbytes

    def activations(self, cfg: Config, local_batch: int) -> ActivationMemory:
        return self.workload.activation_memory(cfg, self.rows, local_batch, "cuda")

    def plan(self, cfg: Config, cluster: Cluster, local_batch: int) -> tuple[Optional[ShardingPlan], str]:
        """TorchRec's plan with the dense state and the activations set aside on every GPU, or,
        where they alone fill it, with only the dense state (a note says so); None and why when
        even then the tables do not fit."""
        model = self.workload.build_model(cfg, self.rows, torch.device("meta"))
        sharder, path = self.workload.embedding_sharder(cfg, "cuda")
        beside = self.dense_bytes + self.activations(cfg, local_batch).peak
        note = ""
        if beside >= cluster.hbm_bytes:
            beside, note = self.dense_bytes, "placed beside the dense state only: the activations alone fill a GPU"
        try:
            return plan_on_cluster(model, path, cfg.sharding, sharder, cluster, beside, local_batch), note
        except PlannerError as e:
            return None, f"TorchRec's planner found no plan: {str(e).strip().splitlines()[0].strip()}"

    def ranks(self, cfg: Config, plan: ShardingPlan, cluster: Cluster, local_batch: int) -> list[RankMemory]:
        """Each GPU's memory under `plan`."""
        gpu = [[0, 0, 0, []] for _ in range(cluster.gpus)]  # tables, optimizer, host, names
        for module_plan in plan.plan.values():
            for table, ps in module_plan.items():
                for rank, (weights, state, host) in self._shard_bytes(table, ps, cluster.gpus):
                    entry = gpu[rank]
                    entry[0] += weights
                    entry[1] += state
                    entry[2] += host
                    entry[3].append(table)
        activations = self.activations(cfg, local_batch).peak
        return [RankMemory(r, int(t), int(o), self.dense_bytes, activations, int(h), tuple(names))
                for r, (t, o, h, names) in enumerate(gpu)]

    def _shard_bytes(self, table: str, ps: ParameterSharding, gpus: int):
        """(rank, (GPU weights or cache, GPU optimizer state, host bytes)) for each shard of `table`."""
        if ps.sharding_spec is None:  # data_parallel: every rank, updated by the dense optimizer with its gradient
            weights = self.rows[table] * self.widths[table] * FP32
            return [(r, (weights, weights * (1 + self.dense_state.per_parameter), 0)) for r in range(gpus)]
        cached = ps.compute_kernel == UVM_CACHING
        load_factor = ps.cache_params.load_factor if cached and ps.cache_params else 1.0
        out = []
        for shard in ps.sharding_spec.shards:
            rows, width = shard.shard_sizes
            weights = rows * width * FP32
            per_row, per_weight = (FP32 * self.table_state.values(rows, 0),
                                   FP32 * (self.table_state.values(rows, width) - self.table_state.values(rows, 0)))
            if cached:  # fbgemm: a row-wise state stays on the GPU, a per-weight one goes to UVM
                out.append((shard.placement.rank(), (weights * load_factor, per_row, weights + per_weight)))
            else:
                out.append((shard.placement.rank(), (weights, per_row + per_weight, 0)))
        return out
