"""What each sharding's owner-side lookup takes: ids (they came through the input all-to-all) and
bags (each one pooled row, looked up and sent in the output all-to-all).

A forward pre-hook on TorchRec's lookup module reads the KJT it is given: its value count and
its bag count are host integers (the id all-to-all's splits put them there), so counting adds no
host sync. Every codec alike: `none`, owner-side `dedup` (every id is looked up; only distinct rows
are sent) and `comm.dedup_at: source` (only distinct bags arrive, variable batch per feature).
"""

from __future__ import annotations

import torch.nn as nn
from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.comm import torchrec_hooks as hooks
from dlrmtrain.comm.stats import COUNTERS_ATTR, DistCommStats


def bags_of(features: KeyedJaggedTensor) -> int:
    """Bags in `features`: per feature its stride, per sample rank under variable batch."""
    if features.variable_stride_per_key():
        return sum(sum(per_rank) for per_rank in features.stride_per_key_per_rank())
    return features.stride() * len(features.keys())


class LookupCounter:
    """Ids and bags of one sharding's lookups (`stats.CountsCommBytes`: they join the stats' sums)."""

    def __init__(self, sharding_type: str) -> None:
        self.comm_stats = DistCommStats(codec="none", sharding_type=sharding_type)

    def __call__(self, _module: nn.Module, args: tuple) -> None:
        features = args[0]
        self.comm_stats.ids_looked_up += features.values().numel()
        self.comm_stats.rows_looked_up += bags_of(features)
        self.comm_stats.steps += 1

    def counted_bytes(self) -> DistCommStats:
        return self.comm_stats


def count_lookups(model: nn.Module) -> int:
    """Attach a `LookupCounter` to each sharding's lookup of every sharded EBC in `model`
    (listed in its `comm_counters`); returns how many were attached."""
    attached = 0
    for m in model.modules():
        listed = getattr(m, COUNTERS_ATTR, [])
        if not isinstance(m, ShardedEmbeddingBagCollection) or any(isinstance(c, LookupCounter) for c in listed):
            continue
        counters = []
        for (sharding_type, _), lookup in zip(hooks.shardings(m), hooks.lookups(m)):
            counter = LookupCounter(sharding_type)
            lookup.register_forward_pre_hook(counter)
            counters.append(counter)
        setattr(m, COUNTERS_ATTR, [*listed, *counters])
        attached += len(counters)
    return attached
