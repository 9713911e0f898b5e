"""Sequence dedup at the source (the sample side, comm/placement.py; DLRMv4's EmbeddingCollection).

Where the batch is made (the sequence loader's prefetch thread), `SequenceSourceDedup`
replaces, per sharding of the sharded EC and per table in it, the ids of the
table's features by the table's distinct ones (sorted), spread evenly over the
features × samples slots: the lengths of the KJT it returns are not the samples'
(TorchRec's own index dedup sends such KJTs). The stock input dist then sends
each distinct id once per destination, the owner looks each up once and the
stock output dist returns one row per distinct id. What the sample rank needs to
expand them stays on it (`SequenceExpansion`, carried by the KJT, never sent):
per sharding its features as the batch has them (real lengths, their per-key
counts on the host) and each position's row among the distinct ids. The sharded
EC (`torchrec.sequence.SourceDedupShardedEC`) hands both to TorchRec's
`construct_jagged_tensors`, which expands with one `index_select` per sharding;
its backward sums the duplicates' gradients (in the rows' dtype, fp32) before
the output all-to-all's backward. Forward rows are the rows `none` looks up:
bitwise equal. All counts are host integers made here: the step needs no host
sync for the codec.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.types import ShardingEnv
from torchrec.modules.embedding_modules import EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.comm.codec import SampleSide
from dlrmtrain.comm.dedup.unique import DistinctIds
from dlrmtrain.comm.labels import PLACEMENT_KEY
from dlrmtrain.recycled import RecycledArrays

DEDUPED_SHARDING_TYPES = ("table_wise", "row_wise")
"""the sharding types whose ids are deduplicated; the others travel whole (identity inverse)"""


@dataclass(frozen=True)
class ShardingFeatures:
    """One sharding of the sharded EC as its input dist takes it."""

    sharding_type: str
    features: list[str]
    """its features, in the order TorchRec's permute and split give them to it"""
    tables: list[str]
    """the table of each feature"""
    rows: dict[str, int]
    """rows of each of its tables (the ids must lie below)"""


@dataclass
class SequenceExpansion:
    """What the sample rank keeps to expand the distinct ids' rows: per sharding, its features as
    the batch has them and each position's row among the distinct ids it sent."""

    features: list[KeyedJaggedTensor]
    reverse: list[torch.Tensor]

    def to(self, device: torch.device, non_blocking: bool = False) -> "SequenceExpansion":
        return SequenceExpansion([f.to(device, non_blocking=non_blocking) for f in self.features],
                                 [r.to(device, non_blocking=non_blocking) for r in self.reverse])

    def pin_memory(self) -> "SequenceExpansion":
        return SequenceExpansion([f.pin_memory() for f in self.features], [r.pin_memory() for r in self.reverse])

    def record_stream(self, stream: torch.Stream) -> None:
        for f in self.features:
            f.record_stream(stream)
        for r in self.reverse:
            r.record_stream(stream)


class DistinctIdsKJT(KeyedJaggedTensor):
    """A KJT of distinct ids (lengths not the samples') with its `expansion`, which moves, pins
    and records streams with it."""

    expansion: SequenceExpansion

    @classmethod
    def of(cls, kjt: KeyedJaggedTensor, expansion: SequenceExpansion) -> "DistinctIdsKJT":
        out = cls(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths(), stride=kjt.stride(),
                  length_per_key=kjt.length_per_key())
        out.expansion = expansion
        return out

    def to(self, device: torch.device, non_blocking: bool = False, dtype: torch.dtype | None = None
           ) -> "DistinctIdsKJT":
        moved = super().to(device, non_blocking=non_blocking, dtype=dtype)
        return DistinctIdsKJT.of(moved, self.expansion.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "DistinctIdsKJT":
        return DistinctIdsKJT.of(super().pin_memory(), self.expansion.pin_memory())

    def record_stream(self, stream: torch.Stream) -> None:
        super().record_stream(stream)
        self.expansion.record_stream(stream)


class SequenceSourceDedup:
    """KJT → `DistinctIdsKJT` for the sharded EC whose shardings are `shardings` (made once)."""

    def __init__(self, shardings: list[ShardingFeatures]) -> None:
        self.shardings = shardings

    def __call__(self, kjt: KeyedJaggedTensor) -> DistinctIdsKJT:
        if isinstance(kjt, DistinctIdsKJT):
            raise ValueError(f"{PLACEMENT_KEY}: source: the batch's ids are already distinct")
        if kjt.weights_or_none() is not None or kjt.variable_stride_per_key():
            raise ValueError(f"{PLACEMENT_KEY}: source: sequence features must be unweighted, one batch size")
        B, keys = kjt.stride(), kjt.keys()
        per_key = dict(zip(keys, zip(kjt.lengths().view(len(keys), B).unbind(0),
                                     torch.split(kjt.values(), kjt.length_per_key()))))
        sent: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        originals, reverse = [], []
        for s in self.shardings:
            lengths = [per_key[f][0] for f in s.features]
            values = [per_key[f][1] for f in s.features]
            counts = [v.numel() for v in values]
            originals.append(KeyedJaggedTensor(keys=s.features, values=_cat(values, kjt.values()),
                                               lengths=_cat(lengths, kjt.lengths()), stride=B,
                                               length_per_key=counts))
            if s.sharding_type in DEDUPED_SHARDING_TYPES:
                distinct, rev = _distinct(s, lengths, values, B)
            else:
                distinct, rev = dict(zip(s.features, zip(lengths, values))), torch.arange(sum(counts))
            sent.update(distinct)
            reverse.append(rev)
        empty = (kjt.lengths().new_zeros(B), kjt.values()[:0])
        out_lengths = [sent.get(k, empty)[0] for k in keys]  # features of no sharding: none sent
        out_values = [sent.get(k, empty)[1] for k in keys]
        out = KeyedJaggedTensor(keys=keys, values=_cat(out_values, kjt.values()),
                                lengths=_cat(out_lengths, kjt.lengths()), stride=B,
                                length_per_key=[v.numel() for v in out_values])
        return DistinctIdsKJT.of(out, SequenceExpansion(originals, reverse))


def _cat(parts: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    if not parts:
        return like[:0]
    if like.device.type == "cpu" and like.dtype == torch.int64:  # the loader's thread: recycled memory
        out = _empty_int64(sum(p.numel() for p in parts))
        np.concatenate([p.numpy() for p in parts], out=out.numpy())
        return out
    return torch.cat(parts).to(like.dtype)


RECYCLED = RecycledArrays(keep=4)
"""The transform's large host tensors (the expansion's features and reverse index, ~65 MB
each a reference-shape batch), over memory a finished batch's used (dlrmtrain/recycled.py):
new memory's page faults were a third of the transform's time."""


def _empty_int64(n: int) -> torch.Tensor:
    return torch.from_numpy(RECYCLED.empty(n))


def _distinct(s: ShardingFeatures, lengths: list[torch.Tensor], values: list[torch.Tensor], B: int
              ) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """Each table's distinct ids over its features in sharding `s`, spread evenly over those
    features' B slots each (feature name → its lengths and ids), and the row of each of the
    sharding's positions among the distinct ids as the sharding's KJT orders them."""
    try:  # per table its distinct ids (sorted)
        found = {t: DistinctIds([values[f] for f, table in enumerate(s.tables) if table == t], s.rows[t])
                 for t in dict.fromkeys(s.tables)}
    except ValueError:  # an id outside its table (DistinctIds's min / max): name it and its feature
        _check_ids(s, values)
        raise
    taken = dict.fromkeys(found, 0)  # of each table's distinct ids, those given to a feature so far
    row_of = {t: torch.empty(len(d.values), dtype=torch.int64) for t, d in found.items()}  # → its KJT row
    out, row = {}, 0
    for f, (feature, t) in enumerate(zip(s.features, s.tables)):
        n_features, j = s.tables.count(t), s.tables[:f].count(t)
        slot_lengths = _spread(len(found[t].values), n_features * B)[j * B:(j + 1) * B]
        n, first = int(slot_lengths.sum()), taken[t]
        row_of[t][first:first + n] = torch.arange(row, row + n)
        out[feature] = (slot_lengths.to(lengths[f].dtype), found[t].values[first:first + n].to(values[f].dtype))
        taken[t], row = first + n, row + n
    reverse = _empty_int64(sum(v.numel() for v in values))  # each position's KJT row
    parts = torch.split(reverse, [v.numel() for v in values])
    for t, d in found.items():
        d.inverse(row_of[t], out=[parts[f] for f, table in enumerate(s.tables) if table == t])
    return out, reverse


def _spread(n: int, slots: int) -> torch.Tensor:
    """n ids over `slots` lengths, as even as can be (the first n % slots one longer)."""
    if slots == 0:
        return torch.zeros(0, dtype=torch.int64)
    return n // slots + (torch.arange(slots) < n % slots).to(torch.int64)


def _check_ids(s: ShardingFeatures, values: list[torch.Tensor]) -> None:
    """Raise naming the first id outside its table: it would silently take another table's key."""
    for f, ids in enumerate(values):
        rows = s.rows[s.tables[f]]
        bad = ids[(ids < 0) | (ids >= rows)]
        if bad.numel():
            raise ValueError(f"EmbeddingCollection dedup at the source ({PLACEMENT_KEY}: source): id {int(bad[0])} "
                             f"of feature {s.features[f]} is outside its table's {rows} rows "
                             f"(negative or too large)")


def sequence_source_transform(model: torch.nn.Module) -> SequenceSourceDedup:
    """The loader's transform for sharded `model`'s one EmbeddingCollection taking distinct ids."""
    from dlrmtrain.comm.torchrec import sequence  # the sharded module: only where one is built

    ecs = [m for m in model.modules() if isinstance(m, sequence.SourceDedupShardedEC)]
    if len(ecs) != 1:
        raise ValueError(f"{PLACEMENT_KEY}: source on sequence tables needs one EmbeddingCollection sharded "
                         f"for it, the model has {len(ecs)}")
    return SequenceSourceDedup([
        ShardingFeatures(sharding_type, features, [table_of[f][0] for f in features],
                         {t: n for t, n in table_of.values()})
        for sharding_type, features, table_of in sequence.source_shardings(ecs[0])])


class SourceDedupEmbeddingCollectionSharder(EmbeddingCollectionSharder):
    """TorchRec's sharder building `SourceDedupShardedEC` (dedup at the source): the stock dists
    carry the distinct ids the loader made (`SequenceSourceDedup`)."""

    def shard(self, module: EmbeddingCollection, params, env: ShardingEnv,
              device: torch.device | None = None, module_fqn: str | None = None):
        from dlrmtrain.comm.torchrec import sequence, sharder

        return sharder.build_sharded(sequence.SourceDedupShardedEC, self, module, params, env, device, module_fqn)

    @property
    def sharded_module_type(self):
        from dlrmtrain.comm.torchrec import sequence

        return sequence.SourceDedupShardedEC


class SequenceSourceSide(SampleSide):
    """`dedup` where the batch is made, sequence (codec.SampleSide): each table's distinct ids
    through TorchRec's stock dists (`SourceDedupEmbeddingCollectionSharder`); every table of the
    EmbeddingCollection alike (declarations: `whole_beside_at_sample` has no sequence)."""

    def sharder(self, fused_params: dict[str, Any]) -> SourceDedupEmbeddingCollectionSharder:
        return SourceDedupEmbeddingCollectionSharder(fused_params=fused_params)

    def transform(self, model: torch.nn.Module, whole_tables: frozenset[str]) -> Callable:
        return sequence_source_transform(model)
