"""What each sharding's owner-side lookup takes: ids (they came through the input all-to-all) and
bags (each one pooled row, looked up and sent in the output all-to-all).

A forward pre-hook on TorchRec's lookup module reads the KJT it is given: its value count and
its bag count are host integers (the id all-to-all's splits put them there), so counting adds no
host sync. Every codec alike: `none`, owner-side `dedup` (every id is looked up; only distinct rows
are sent) and dedup at the source (only distinct bags arrive, variable batch per feature).
Counted in whole rows: a column-wise table's ids and bags reach each of its column shards' owners,
and count once, on its feature's first shard (`DistLayout.first_shard`), as a table-wise table's.
"""

from __future__ import annotations

import torch.distributed as dist
import torch.nn as nn
from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.comm.torchrec import pooled, sharded
from dlrmtrain.comm.layout import DistLayout, layout_for
from dlrmtrain.comm.stats import CommCounters, DistCommStats


def bags_per_key(features: KeyedJaggedTensor) -> list[int]:
    """Bags per feature of `features`: its stride, summed over sample ranks under variable batch."""
    if features.variable_stride_per_key():
        return [sum(per_rank) for per_rank in features.stride_per_key_per_rank()]
    return [features.stride()] * len(features.keys())


class LookupCounter:
    """Ids and bags of one sharding's lookups (`stats.CountsCommBytes`: they join the stats' sums).

    `first`: (feature, counts) per feature of the lookup's KJT, in its order: whether the feature
    counts here (its first column shard); None: every feature does."""

    def __init__(self, sharding_type: str, first: list[tuple[str, bool]] | None = None) -> None:
        self.comm_stats = DistCommStats(codec="none", sharding_type=sharding_type)
        every = first is None or all(f for _, f in first)
        self._keys = None if every else [k for k, _ in first]
        self._counts = None if every else [f for _, f in first]

    def __call__(self, _module: nn.Module, args: tuple) -> None:
        features, counts = args[0], self._counts
        self.comm_stats.steps += 1
        if counts is None:
            self.comm_stats.ids_looked_up += features.values().numel()
            self.comm_stats.rows_looked_up += sum(bags_per_key(features))
            return
        if features.keys() != self._keys:  # the layout's order, or the counts are wrong
            raise ValueError(f"{self.comm_stats.sharding_type} lookup got features {features.keys()}, "
                             f"its layout has {self._keys}")
        self.comm_stats.rows_looked_up += sum(n for n, f in zip(bags_per_key(features), counts) if f)
        # On the host already: TorchRec's id all-to-all ends with `KeyedJaggedTensor.sync()`, which
        # fills them (tests/comm/test_lookups.py pins it), so reading them here syncs nothing.
        per_key = features.length_per_key()
        self.comm_stats.ids_looked_up += sum(n for n, f in zip(per_key, counts) if f)

    def counted_bytes(self) -> DistCommStats:
        return self.comm_stats


def _first_shards(ebc: ShardedEmbeddingBagCollection, sharding_type: str, sharding
                  ) -> list[tuple[str, bool]] | None:
    """(feature, whether it is its first column shard) per feature of this rank's lookup (None:
    a sharding without column shards)."""
    env = sharded.sharding_env(ebc)
    layout = layout_for(sharding_type, sharding, env.world_size)
    if not isinstance(layout, DistLayout):
        return None
    rank = dist.get_rank(env.process_group)
    return [(e.feature, f) for e, f in zip(layout.entries_per_rank[rank], layout.first_shard[rank], strict=True)]


def count_lookups(model: nn.Module, counters: CommCounters) -> int:
    """Attach a `LookupCounter` to each sharding's lookup of every sharded EBC in `model`, added
    to the run's `counters`; returns how many were attached."""
    attached = 0
    for m in model.modules():
        if not isinstance(m, ShardedEmbeddingBagCollection):
            continue
        for (sharding_type, sharding), lookup in zip(pooled.shardings(m), pooled.lookups(m)):
            counter = LookupCounter(sharding_type, _first_shards(m, sharding_type, sharding))
            lookup.register_forward_pre_hook(counter)
            counters.add(counter)
            attached += 1
    return attached
