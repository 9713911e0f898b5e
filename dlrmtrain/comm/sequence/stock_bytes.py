"""What TorchRec's stock sequence all-to-all moves: one row per id position, per table.

The sequence counterpart of comm/stock_bytes.py. `none` keeps TorchRec's
`SequenceEmbeddingsAllToAll` untouched; a forward pre-hook sums each step's
positions per table on the device (from the lengths both ends hold) and the
sums are read back only with the counters, so counting adds no host sync.
`auto`'s `none` path (auto.py) counts the same way.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torchrec.distributed.embedding import ShardedEmbeddingCollection

from dlrmtrain.comm import torchrec_hooks as hooks
from dlrmtrain.comm.dedup.kernels import host_to_device
from dlrmtrain.comm.layout import layout_for
from dlrmtrain.comm.sequence.layout import SequenceLayout, sequence_layout_of
from dlrmtrain.comm.stats import COUNTERS_ATTR, CountsCommBytes, DistCommStats

COUNTED_SHARDING_TYPES = ("table_wise", "row_wise")


class SequenceStockCounter:
    """Positions per table of one sequence all-to-all, summed on the device."""

    def __init__(self, layout: SequenceLayout, sharding_type: str, codec: str = "none") -> None:
        self.layout = layout
        self.elem_bytes = 4
        self.stats = DistCommStats(codec=codec, sharding_type=sharding_type,
                                   table_codecs={t: codec for t in layout.tables})
        self._sent: torch.Tensor | None = None      # [tables] rows this rank sends (as owner)
        self._received: torch.Tensor | None = None  # [tables] rows it receives (as sample rank)

    def count(self, sharding_ctx, elem_bytes: int) -> None:
        """Add one pass (TorchRec's sharding context holds both ends' lengths)."""
        owner_lengths, sample_lengths = hooks.sequence_lengths_of_both_ends(sharding_ctx)
        lay = self.layout
        if self._sent is None:
            T, device = len(lay.tables), sample_lengths.device
            self._sent = torch.zeros(T, dtype=torch.int64, device=device)
            self._received = torch.zeros(T, dtype=torch.int64, device=device)
        for acc, lengths, tables in ((self._sent, owner_lengths, lay.owner_tables),
                                     (self._received, sample_lengths, lay.sample_tables)):
            if tables:
                per_feature = lengths.reshape(len(tables), -1).sum(1).to(torch.int64)
                acc.index_add_(0, host_to_device(tables, acc.device), per_feature)
        self.elem_bytes = elem_bytes
        self.stats.steps += 1

    def flush(self) -> DistCommStats:
        """The counters, with the positions summed so far added (a host read: only when read)."""
        if self._sent is not None:
            sent, received = self._sent.tolist(), self._received.tolist()
            for t, name in enumerate(self.layout.tables):
                self.stats.table(name).add_rows(self.layout.dim, self.elem_bytes, self.elem_bytes, sent=sent[t],
                                                received=received[t], stock_sent=sent[t],
                                                stock_received=received[t], bags=received[t],
                                                distinct=received[t])
            self._sent = self._received = None
        return self.stats

    def __call__(self, _module: nn.Module, args: tuple) -> None:
        """Forward pre-hook on the stock dist: (local_embs, sharding_ctx)."""
        self.count(args[1], args[0].element_size())

    def counted_bytes(self) -> DistCommStats:
        """`stats.CountsCommBytes`"""
        return self.flush()


def count_sequence_stock_dists(model: nn.Module) -> int:
    """Attach a `SequenceStockCounter` to every table-/row-wise stock sequence dist in `model`.

    Codec dists count themselves; the counters join them in each sharded EC's
    `comm_counters`. Column-wise sequence dists and TorchRec's qcomms are not
    counted. Returns how many were attached.
    """
    attached = 0
    for m in model.modules():
        listed = getattr(m, COUNTERS_ATTR, [])
        if not isinstance(m, ShardedEmbeddingCollection) or any(isinstance(c, SequenceStockCounter)
                                                                for c in listed):
            continue
        env = hooks.sharding_env(m)
        rank = dist.get_rank(env.process_group)
        counters = []
        for (sharding_type, sharding), out_dist in zip(hooks.ec_shardings(m), hooks.output_dists(m)):
            if (sharding_type not in COUNTED_SHARDING_TYPES or isinstance(out_dist, CountsCommBytes)
                    or hooks.qcomm_codecs(out_dist) is not None):
                continue
            layout = sequence_layout_of(layout_for(sharding_type, sharding, env.world_size), rank)
            counter = SequenceStockCounter(layout, sharding_type)
            out_dist.register_forward_pre_hook(counter)
            counters.append(counter)
        setattr(m, COUNTERS_ATTR, [*listed, *counters])
        attached += len(counters)
    return attached
