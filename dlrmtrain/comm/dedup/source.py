"""Dedup at the source (the sample side, comm/placement.py): a batch's bags replaced by its distinct ones.

`distinct_bags(kjt)` turns a sample rank's `KeyedJaggedTensor` into TorchRec's
variable-batch form (VBE): per feature, only its distinct bags
(`stride_per_key_per_rank`), plus `inverse_indices` = (keys, [F, B]) mapping each
sample to its distinct bag. TorchRec's sharded EBC then sends only those bags'
ids in the input all-to-all, its fused TBE looks up only them, the output
all-to-all carries one pooled row per distinct bag, and the EBC expands the rows
back to the full batch with the inverse (its backward sums the duplicates'
gradients before they are sent). Lossless: a distinct bag holds the same ids in
the same order, so its pooled row is the same sum, bitwise.

Bags are compared whole: same length, same ids, same order (their distinct ones found by
comm/dedup/unique.py on the CPU, torch.unique elsewhere); the counts come to the host here, where the batch is made
(the loader's prefetch thread), so the training step needs no host sync for them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from typing import Any

import torch
import torch.nn as nn
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder, ShardedEmbeddingBagCollection
from torchrec.distributed.types import ShardingEnv
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.comm.codec import SampleSide
from dlrmtrain.comm.dedup.unique import unique_keys, unique_rows
from dlrmtrain.comm.labels import PLACEMENT_KEY
from dlrmtrain.comm.torchrec import pooled, pooled_source, sharder, vbe

DEDUPED_SHARDING_TYPES = ("table_wise", "column_wise", "row_wise")
"""the sharding types whose features `source` deduplicates (the others travel whole); row-wise
needs `row_wise_dists_for_source` on the sharded model"""
_KEY_LIMIT = 2 ** 62
"""one-hot keys (feature · span + id) stay below this, else the multi-hot path keys them"""


class SourceDedupEBCSharder(EmbeddingBagCollectionSharder):
    """TorchRec's EBC sharder for dedup at the source: TorchRec's own dists and lookups carry
    the variable batch; its sharded module expands the rows in one gather
    (`torchrec.pooled_source.RowGatherExpandShardedEBC`) and the CPU TBE's per-batch VBE metadata is
    made in whole-tensor ops (`torchrec.vbe.register_cpu_vbe_metadata`)."""

    def shard(self, module: EmbeddingBagCollection, params, env: ShardingEnv,
              device: torch.device | None = None, module_fqn: str | None = None):
        vbe.register_cpu_vbe_metadata()
        return sharder.build_sharded(pooled_source.RowGatherExpandShardedEBC, self, module, params, env, device, module_fqn)

    @property
    def sharded_module_type(self):
        return pooled_source.RowGatherExpandShardedEBC


def features_kept_whole(model: nn.Module, whole_tables: Collection[str]) -> frozenset[str]:
    """Features that travel whole under `source`: those of tables sharded other than table-,
    column- or row-wise (data-parallel: no all-to-all to save) and of `whole_tables` (whose
    codec does not dedup, e.g. per-table `none`)."""
    kept: set[str] = set()
    for m in model.modules():
        if isinstance(m, ShardedEmbeddingBagCollection):
            for sharding_type, tables in pooled.features_per_sharding_type(m).items():
                for table, features in tables.items():
                    if sharding_type not in DEDUPED_SHARDING_TYPES or table in whole_tables:
                        kept.update(features)
    return frozenset(kept)


def row_wise_dists_for_source(model: nn.Module) -> None:
    """Let row-wise tables of sharded `model` take distinct bags: TorchRec's variable-batch
    reduce-scatter backward all-gathers uneven sizes, which Gloo refuses, and its dist serves
    only the batch kind of its first call (`auto` at the source sends both). Each such dist is
    given one that serves both and, over Gloo, gathers padded to the longest part
    (comm/torchrec/pooled_source.py); NCCL keeps TorchRec's uneven all-gather."""
    for m in model.modules():
        if isinstance(m, ShardedEmbeddingBagCollection):
            pooled_source.row_wise_dists_for_source(m)


def source_transform(model: nn.Module, whole_tables: Collection[str] = ()
                     ) -> Callable[[KeyedJaggedTensor], KeyedJaggedTensor]:
    """The batch transform of a run deduplicating at the source on sharded `model`."""
    return functools.partial(distinct_bags, keep=features_kept_whole(model, whole_tables))


class PooledSourceSide(SampleSide):
    """`dedup` where the batch is made, pooled (codec.SampleSide): each feature's distinct bags
    through TorchRec's stock, variable-batch EBC (`SourceDedupEBCSharder`); row-wise tables take
    them too (`row_wise_dists_for_source`); tables whose codec does not dedup travel whole (declarations: `whole_beside_at_sample`)."""

    def sharder(self, fused_params: dict[str, Any]) -> SourceDedupEBCSharder:
        return SourceDedupEBCSharder(fused_params=fused_params)

    def install(self, model: nn.Module) -> None:
        row_wise_dists_for_source(model)

    def transform(self, model: nn.Module, whole_tables: frozenset[str]) -> Callable:
        return source_transform(model, whole_tables)


def distinct_bags(kjt: KeyedJaggedTensor, keep: Collection[str] = ()) -> KeyedJaggedTensor:
    """The VBE KJT of `kjt`'s distinct bags per feature, with its inverse indices.

    `keep`: features sent whole (stride B, the identity inverse): the row-wise
    ones (`features_kept_whole`). Refuses weighted and already
    variable-batch KJTs.
    """
    if kjt.weights_or_none() is not None:
        raise ValueError(f"{PLACEMENT_KEY}: source: weighted (per-id weight) features are not supported")
    if kjt.variable_stride_per_key():
        raise ValueError(f"{PLACEMENT_KEY}: source: the batch is already variable-batch (VBE)")
    keys = kjt.keys()
    F, B = len(keys), kjt.stride()
    lengths, values = kjt.lengths(), kjt.values()
    device = values.device
    if F == 0:
        return kjt
    if B == 0:  # a rank with no samples: no bags to send
        return KeyedJaggedTensor(keys=keys, values=values, lengths=lengths,
                                 stride_per_key_per_rank=[[0] for _ in keys],
                                 inverse_indices=(keys, torch.zeros(F, 0, dtype=torch.int64, device=device)))
    lengths_2d = lengths.view(F, B)
    longest = int(lengths.max())
    if longest <= 1 and values.numel():
        lo, hi = int(values.min()), int(values.max())
        span = hi - lo + 2
        one_hot = F * span < _KEY_LIMIT
    else:
        lo, span, one_hot = 0, 2, longest <= 1  # no ids at all: every bag is empty
    if one_hot:
        per_feature = _one_hot(lengths, values, F, B, lo, span)
    else:
        per_feature = _multi_hot(lengths_2d, values, longest, {f for f, k in enumerate(keys) if k in keep})
    out_values, out_lengths, strides, inverse = [], [], [], []
    starts = torch.cumsum(lengths_2d.sum(1), 0).tolist()
    for f, key in enumerate(keys):
        if key in keep:
            start = starts[f - 1] if f else 0
            out_values.append(values[start:starts[f]])
            out_lengths.append(lengths_2d[f])
            strides.append([B])
            inverse.append(torch.arange(B, device=device))
        else:
            v, n_lengths, inv = per_feature[f]
            out_values.append(v)
            out_lengths.append(n_lengths)
            strides.append([n_lengths.numel()])
            inverse.append(inv)
    return KeyedJaggedTensor(
        keys=keys, values=torch.cat(out_values).to(values.dtype),
        lengths=torch.cat(out_lengths).to(lengths.dtype), stride_per_key_per_rank=strides,
        inverse_indices=(keys, torch.stack(inverse).to(torch.int64)))


def _one_hot(lengths: torch.Tensor, values: torch.Tensor, F: int, B: int, lo: int, span: int
             ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Bags of at most one id, every feature in one unique: key = feature · span + (id - lo + 1),
    or feature · span for an empty bag. Per feature: (distinct ids, their lengths, inverse)."""
    present = lengths.bool()
    code = torch.zeros(F * B, dtype=torch.int64, device=values.device)
    code[present] = values.to(torch.int64) - lo + 1
    feature = torch.arange(F, device=values.device).repeat_interleave(B)
    keys = feature * span + code
    uniq, (inv,) = unique_keys([keys], F * span)
    u_feature, u_code = uniq // span, uniq % span
    counts = torch.bincount(u_feature, minlength=F).tolist()
    offsets = [0]
    for c in counts:
        offsets.append(offsets[-1] + c)
    inv = inv.view(F, B) - torch.tensor(offsets[:-1], device=values.device).unsqueeze(1)
    out = []
    for f in range(F):
        c = u_code[offsets[f]:offsets[f + 1]]
        n_lengths = (c != 0).to(torch.int64)
        out.append((c[c != 0] + lo - 1, n_lengths, inv[f]))
    return out


def _multi_hot(lengths_2d: torch.Tensor, values: torch.Tensor, longest: int, whole: Collection[int]
               ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None]:
    """Bags as rows [length, id_0, ..., id_{L-1}] (zero-padded: the length tells a padded id from a
    real one), one unique over the rows per feature. Per feature: (distinct bags' ids, lengths,
    inverse); None for the features in `whole`, which travel whole (no unique to throw away)."""
    F, B = lengths_2d.shape
    device = values.device
    pos = torch.arange(longest, device=device)
    out = []
    feature_ids = torch.split(values, lengths_2d.sum(1).tolist())
    for f in range(F):
        if f in whole:
            out.append(None)
            continue
        lens = lengths_2d[f].to(torch.int64)
        width = int(lens.max()) if B else 0
        rows = torch.zeros(B, width + 1, dtype=torch.int64, device=device)
        rows[:, 0] = lens
        valid = pos[:width].unsqueeze(0) < lens.unsqueeze(1)
        rows[:, 1:][valid] = feature_ids[f].to(torch.int64)
        uniq, inv = unique_rows(rows)
        u_lens = uniq[:, 0]
        u_valid = pos[:width].unsqueeze(0) < u_lens.unsqueeze(1)
        out.append((uniq[:, 1:][u_valid], u_lens, inv))
    return out
