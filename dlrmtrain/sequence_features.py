"""The DLRMv4 (HSTU on Yambda) feature layout every layer shares: feature and table
names, table sizes, the batch the data yields and the model reads.

Mirrors the MLPerf reference (mlcommons/training `recommendation_v4`,
`dlrm_v4/configs.py` for `yambda-5b` and `dlrm_v4/datasets/dataset.py`'s `Samples`),
so a batch here means what a batch there means. A leaf module (torch and
torchrec's KJT only): the data path, the model and the scripts import this one
definition without importing each other.

A batch holds, per sample, its user-interaction history (UIH: one row per past
event, oldest first, preceded by the contextual features) and its candidate
(one item to score). Jagged features have one value per history position;
contextual features (`uid` and the hashed crosses) one value per sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from torchrec.streamable import Pipelineable

EMBEDDING_DIM = 512
"""Width of every table in the full-size model (reference HSTU_EMBEDDING_DIM)."""

# (name, keys hashed together, rows, salt): the reference's YAMBDA_5B_CROSS_SPECS.
CROSS_SPECS: list[tuple[str, tuple[str, ...], int, int]] = [
    ("user_x_artist", ("uid", "artist_id"), 100_000_000, 0),
    ("user_x_album", ("uid", "album_id"), 40_000_000, 0),
    ("user_x_hour", ("uid", "hour_of_day"), 24_000_000, 0),
    ("item_x_hour", ("item_id", "hour_of_day"), 40_000_000, 0),
    ("artist_x_hour", ("artist_id", "hour_of_day"), 32_000_000, 0),
    ("user_x_is_organic", ("uid", "is_organic"), 2_000_000, 0),
    ("user_x_artist_x_hour", ("uid", "artist_id", "hour_of_day"), 40_000_000, 0),
]
CROSS_NAMES: list[str] = [name for name, _keys, _rows, _salt in CROSS_SPECS]

CONTEXTUAL_FEATURES: list[str] = ["uid", *CROSS_NAMES]
"""One value per sample, placed before the history in the model's sequence."""

UIH_FEATURES: list[str] = [
    *CONTEXTUAL_FEATURES,
    "item_id", "artist_id", "album_id",        # embedded, one per history event
    "action_weight",                           # bits: 1 listen_plus, 2 like, 4 skip
    "action_timestamp",                        # seconds
    "dummy_watch_time",                        # zeros (the reference keeps the slot)
]
"""Keys of `SequenceBatch.uih`, in this order."""

HISTORY_FEATURES: list[str] = [f for f in UIH_FEATURES if f not in CONTEXTUAL_FEATURES]
"""The UIH keys with one value per past event (jagged: a sample has as many as its history);
every other key has one value per sample."""

CANDIDATE_FEATURES: list[str] = [
    "item_candidate_id", "item_candidate_artist_id", "item_candidate_album_id",
    "item_query_time",                         # the last history event's timestamp (the
                                               # anchor's own when the history is empty)
    "item_action_weight",                      # its action bits: the label source
    "item_dummy_watchtime",
]
"""Keys of `SequenceBatch.candidates`, in this order (one value per sample each)."""

UIH_TO_CANDIDATE: list[tuple[str, str]] = [
    ("item_id", "item_candidate_id"),
    ("artist_id", "item_candidate_artist_id"),
    ("album_id", "item_candidate_album_id"),
    ("action_weight", "item_action_weight"),
    ("action_timestamp", "item_query_time"),
    ("dummy_watch_time", "item_dummy_watchtime"),
]
"""The reference's merge_uih_candidate_feature_mapping."""

# Table → (rows in the full-size model, features that share it).
TABLES: dict[str, tuple[int, list[str]]] = {
    "item_id": (9_390_624, ["item_id", "item_candidate_id"]),
    "artist_id": (1_293_395, ["artist_id", "item_candidate_artist_id"]),
    "album_id": (3_367_692, ["album_id", "item_candidate_album_id"]),
    "uid": (1_000_001, ["uid"]),
    **{name: (rows, [name]) for name, _keys, rows, _salt in CROSS_SPECS},
}
EMBEDDED_FEATURES: list[str] = [f for _rows, features in TABLES.values() for f in features]

LISTEN_PLUS_BIT = 1
"""`item_action_weight & LISTEN_PLUS_BIT` is the label (task `listen_plus`, weight 1)."""


@dataclass
class SequenceBatch(Pipelineable):
    """One rank's DLRMv4 batch (the reference's `Samples`); Pipelineable, so TorchRec's
    train pipelines can move it and record its streams.

    `sparse` is `uih` and `candidates` concatenated (keys uih + candidates), built on
    the data side so the sharded EmbeddingCollection's input is a plain attribute
    of the batch (a pipeline can then run its input all-to-all at prefetch).
    """

    uih: KeyedJaggedTensor
    candidates: KeyedJaggedTensor
    sparse: KeyedJaggedTensor
    distinct_sparse: KeyedJaggedTensor | None = None
    """under `comm.codec: auto` at the source, `sparse`'s distinct ids beside it (the loader's
    `DistinctIdsKJT`; comm/auto/source.py picks one form per step)"""

    @classmethod
    def of(cls, uih: KeyedJaggedTensor, candidates: KeyedJaggedTensor) -> "SequenceBatch":
        """The batch of two KJTs (their values and lengths copied into `sparse`'s)."""
        return cls.joined(torch.cat([uih.values(), candidates.values()]),
                          torch.cat([uih.lengths(), candidates.lengths()]),
                          uih.values().numel(), uih.lengths().numel())

    @classmethod
    def joined(cls, values: torch.Tensor, lengths: torch.Tensor, uih_values: int,
               uih_lengths: int) -> "SequenceBatch":
        """The batch whose `sparse` holds `values` and `lengths` (UIH_FEATURES then
        CANDIDATE_FEATURES, key-major); `uih` and `candidates` are views of its two parts,
        the first `uih_values` values and `uih_lengths` lengths, and the rest (no copy)."""
        uih = KeyedJaggedTensor(keys=list(UIH_FEATURES), values=values[:uih_values],
                                lengths=lengths[:uih_lengths])
        candidates = KeyedJaggedTensor(keys=list(CANDIDATE_FEATURES), values=values[uih_values:],
                                       lengths=lengths[uih_lengths:])
        sparse = KeyedJaggedTensor.from_lengths_sync(keys=list(UIH_FEATURES) + list(CANDIDATE_FEATURES),
                                                     values=values, lengths=lengths)
        return cls(uih, candidates, sparse)

    @property
    def batch_size(self) -> int:
        return self.uih.stride()

    def labels(self) -> torch.Tensor:
        """float32 [B]: the candidate's listen_plus bit."""
        bits = self.candidates["item_action_weight"].values()
        return (bits.to(torch.int64) & LISTEN_PLUS_BIT).ne(0).to(torch.float32)

    def to(self, device: torch.device, non_blocking: bool = False) -> "SequenceBatch":
        return self.moved(lambda kjt: kjt.to(device, non_blocking=non_blocking))

    def moved(self, move: Callable[[KeyedJaggedTensor], KeyedJaggedTensor]) -> "SequenceBatch":
        """The batch with each KJT passed through `move` (a device copy, a pin). Where `uih` and
        `candidates` are views of `sparse` (`joined`), `sparse` alone is moved and they are
        taken as views of the moved values again: a batch's values are copied once, not once
        per KJT (at the reference shape ~0.26 GB a batch would be pinned and sent twice); they
        keep their per-key lengths, known here, so a device batch needs no host sync to split.
        Where `sparse` holds something else (dedup at the source: the distinct ids), each moves."""
        distinct = None if self.distinct_sparse is None else move(self.distinct_sparse)
        if not self._parts_view_sparse():
            return SequenceBatch(move(self.uih), move(self.candidates), move(self.sparse), distinct)
        sparse = move(self.sparse)
        return SequenceBatch(_part_of(sparse, self.uih, 0, 0),
                             _part_of(sparse, self.candidates, self.uih.values().numel(),
                                      self.uih.lengths().numel()), sparse, distinct)

    def _parts_view_sparse(self) -> bool:
        """Whether `uih` then `candidates` are `sparse`'s values and lengths, in place (`joined`)."""
        def at(part: torch.Tensor, whole: torch.Tensor, start: int) -> bool:
            return part.numel() == 0 or (part.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()
                                         and part.data_ptr() == whole.data_ptr() + start * whole.element_size())
        values, lengths = self.sparse.values(), self.sparse.lengths()
        n_values, n_lengths = self.uih.values().numel(), self.uih.lengths().numel()
        return list(self.sparse.keys()) == list(self.uih.keys()) + list(self.candidates.keys()) and \
            values.numel() == n_values + self.candidates.values().numel() and \
            at(self.uih.values(), values, 0) and at(self.candidates.values(), values, n_values) and \
            at(self.uih.lengths(), lengths, 0) and at(self.candidates.lengths(), lengths, n_lengths)

    def record_stream(self, stream: torch.Stream) -> None:
        for kjt in (self.uih, self.candidates, self.sparse, self.distinct_sparse):
            if kjt is not None:
                kjt.record_stream(stream)

    def pin_memory(self) -> "SequenceBatch":
        return self.moved(lambda kjt: kjt.pin_memory())  # each KJT's own (DistinctIdsKJT pins its expansion)


def _part_of(sparse: KeyedJaggedTensor, part: KeyedJaggedTensor, value_start: int,
             length_start: int) -> KeyedJaggedTensor:
    """`part` (uih or candidates) as a view of `sparse`, whose values and lengths hold it from
    `value_start` and `length_start`; its per-key lengths taken from `part` (no sync)."""
    n_values, n_lengths = part.values().numel(), part.lengths().numel()
    return KeyedJaggedTensor(keys=list(part.keys()), values=sparse.values()[value_start:value_start + n_values],
                             lengths=sparse.lengths()[length_start:length_start + n_lengths],
                             stride=part.stride(), length_per_key=part.length_per_key())