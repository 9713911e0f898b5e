"""`auto` on a sequence-embedding all-to-all: `none` or sequence `dedup`, whichever measures faster.

The pooled path's `AutoDist` (comm/auto/dist.py) decides per all-to-all with
the same policy; only what its `none` path counts differs: a sequence
all-to-all moves one row per id position, not one per bag, counted by a
`SequenceStockCounter` (stock_bytes.py: summed on the device, read back only
with the counters, so the `none` path adds no host sync), also once settled.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torchrec.distributed.types import Awaitable

from dlrmtrain.comm.auto.dist import AutoDist
from dlrmtrain.comm.auto.policy import AutoPolicy
from dlrmtrain.comm.codec import DistSpec
from dlrmtrain.comm.stock_bytes import SequenceStockCounter
from dlrmtrain.comm.stats import DistCommStats


class SequenceAutoDist(AutoDist):
    """`AutoDist` over a sequence all-to-all: its `none` path counts positions, not bags."""

    def __init__(self, spec: DistSpec, dedup_dist: nn.Module, policy: AutoPolicy | None = None) -> None:
        super().__init__(spec, dedup_dist, policy or AutoPolicy())
        self.stock_counter = SequenceStockCounter(spec.layout, spec.sharding_type)

    def _run(self, path: str, local_embs: torch.Tensor, sharding_ctx) -> Awaitable[torch.Tensor]:
        if path == "dedup":
            return self.dedup_dist(local_embs, sharding_ctx)
        self.stock_counter.count(sharding_ctx, local_embs.element_size())
        return self.stock_dist(local_embs, sharding_ctx)

    def _tally_settled(self, local_embs: torch.Tensor, sharding_ctx) -> None:
        """Settled on none: count positions as `_run`'s none path does (summed on the device)."""
        self.stock_counter.count(sharding_ctx, local_embs.element_size())

    def _merged_stats(self) -> DistCommStats:
        counted = self.stock_counter.flush()
        self.none_stats.steps = counted.steps
        self.none_stats.tables = counted.tables
        self.none_stats.ids_looked_up, self.none_stats.rows_looked_up = counted.ids_looked_up, counted.rows_looked_up
        return AutoDist.comm_stats.fget(self)

    def _restart_stats(self, value: DistCommStats) -> None:
        AutoDist.comm_stats.fset(self, value)
        self.stock_counter = SequenceStockCounter(self.stock_counter.layout, self.sharding_type)

    comm_stats = property(_merged_stats, _restart_stats)
