"""`auto` on a sequence-embedding all-to-all: `none` or sequence `dedup`, whichever measures faster.

The pooled path's `AutoDist` (comm/auto/codec.py) decides per all-to-all with
the same policy; only what its `none` path counts differs: a sequence
all-to-all moves one row per id position, not one per bag. Those positions are
summed per table on the device each `none` step and read back only when the
counters are read (`SequenceStockCounter`), so the `none` path adds no host sync.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torchrec.distributed.embedding_sharding import EmbeddingShardingContext
from torchrec.distributed.types import Awaitable

from dlrmtrain.comm.auto.codec import AutoDist
from dlrmtrain.comm.auto.policy import AutoPolicy
from dlrmtrain.comm.dedup.kernels import host_to_device
from dlrmtrain.comm.sequence.layout import SequenceLayout
from dlrmtrain.comm.stats import DistCommStats
from dlrmtrain.comm.torchrec_hooks import ids_of_both_ends


class SequenceStockCounter:
    """What TorchRec's stock sequence all-to-all moves: positions per table, summed on the device."""

    def __init__(self, layout: SequenceLayout) -> None:
        self.layout = layout
        self.elem_bytes = 4
        self._sent: torch.Tensor | None = None      # [tables] rows this rank sends (owner)
        self._received: torch.Tensor | None = None  # [tables] rows it receives (sample rank)

    def count(self, sharding_ctx: EmbeddingShardingContext, elem_bytes: int) -> None:
        owner, sample = ids_of_both_ends(sharding_ctx)
        lay, T = self.layout, len(self.layout.tables)
        device = sample.lengths().device
        if self._sent is None:
            self._sent = torch.zeros(T, dtype=torch.int64, device=device)
            self._received = torch.zeros(T, dtype=torch.int64, device=device)
        for acc, kjt, tables in ((self._sent, owner, lay.owner_tables), (self._received, sample, lay.sample_tables)):
            if tables:
                per_feature = kjt.lengths().view(len(tables), -1).sum(1)
                acc.index_add_(0, host_to_device(tables, device), per_feature.to(torch.int64))
        self.elem_bytes = elem_bytes

    def flush_into(self, stats: DistCommStats) -> None:
        """Add the positions counted so far to `stats` (a host read: only when counters are read)."""
        if self._sent is None:
            return
        sent, received = self._sent.tolist(), self._received.tolist()
        for t, name in enumerate(self.layout.tables):
            stats.table(name).add_rows(self.layout.dim, self.elem_bytes, self.elem_bytes, sent=sent[t],
                                       received=received[t], stock_sent=sent[t], stock_received=received[t],
                                       bags=received[t], distinct=received[t])
        self._sent = self._received = None


class SequenceAutoDist(AutoDist):
    """`AutoDist` over a sequence all-to-all: its `none` path counts positions, not bags."""

    def __init__(self, stock_dist: nn.Module, dedup_dist: nn.Module, layout: SequenceLayout, tables: set[str],
                 pg: dist.ProcessGroup, sharding_type: str, policy: AutoPolicy | None = None) -> None:
        super().__init__(stock_dist, dedup_dist, layout, tables, pg, sharding_type, policy or AutoPolicy())
        self.stock_counter = SequenceStockCounter(layout)

    def _run(self, path: str, local_embs: torch.Tensor, sharding_ctx) -> Awaitable[torch.Tensor]:
        if path == "dedup":
            return self.dedup_dist(local_embs, sharding_ctx)
        self.stock_counter.count(sharding_ctx, local_embs.element_size())
        self.none_stats.steps += 1
        return self.stock_dist(local_embs, sharding_ctx)

    def _merged_stats(self) -> DistCommStats:
        self.stock_counter.flush_into(self.none_stats)
        return AutoDist.comm_stats.fget(self)

    def _restart_stats(self, value: DistCommStats) -> None:
        self.stock_counter.flush_into(DistCommStats(codec="none", sharding_type=self.sharding_type))
        AutoDist.comm_stats.fset(self, value)

    comm_stats = property(_merged_stats, _restart_stats)
