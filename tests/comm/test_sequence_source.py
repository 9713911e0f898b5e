"""The loader's half of sequence dedup at the source (comm/dedup/sequence_source.py), on one
process: what the sharded EC is sent (each table's distinct ids per sharding, keys and batch
kept) and what the sample rank keeps to expand the rows (real lengths, reverse indices).
The multi-rank behaviour (forward bitwise `none`'s, counters, pipelines) is in
test_sequence_dedup.py and tests/multiproc/test_dlrmv4.py."""

from __future__ import annotations

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.comm.dedup.sequence_source import DistinctIdsKJT, SequenceSourceDedup, ShardingFeatures

# sharding 0 (table-wise): a and c share table T (10 rows), b reads U (5 rows); sharding 1
# (column-wise: sent whole) reads d. The input KJT's keys are in another order, with a feature
# `x` no sharding reads.
SHARDINGS = [ShardingFeatures("table_wise", ["a", "b", "c"], ["T", "U", "T"], {"T": 10, "U": 5}),
             ShardingFeatures("column_wise", ["d"], ["V"], {"V": 4})]
KEYS = ["c", "x", "a", "d", "b"]


def _kjt(seqs: dict[str, list[list[int]]]) -> KeyedJaggedTensor:
    lengths = [len(s) for k in KEYS for s in seqs[k]]
    values = [i for k in KEYS for s in seqs[k] for i in s]
    return KeyedJaggedTensor.from_lengths_sync(KEYS, torch.tensor(values), torch.tensor(lengths))


SEQS = {"a": [[3, 3, 7], [7]], "b": [[1, 1], [1, 4]], "c": [[3], [9, 3, 3]], "d": [[2, 2], []], "x": [[5], [5]]}


def _sharding_values(kjt: KeyedJaggedTensor, features: list[str]) -> torch.Tensor:
    d = kjt.to_dict()
    return torch.cat([d[f].values() for f in features])


def test_each_tables_distinct_ids_are_sent_once_and_the_reverse_gives_every_position_back():
    kjt = _kjt(SEQS)
    out = SequenceSourceDedup(SHARDINGS)(kjt)
    assert isinstance(out, DistinctIdsKJT) and out.keys() == KEYS and out.stride() == 2
    sent = out.to_dict()
    # T's distinct ids {3, 7, 9} over a's and c's 4 slots, U's {1, 4} over b's 2; x: nothing
    assert sorted(sent["a"].values().tolist() + sent["c"].values().tolist()) == [3, 7, 9]
    assert sorted(sent["b"].values().tolist()) == [1, 4]
    assert sent["x"].values().numel() == 0 and sent["d"].values().tolist() == [2, 2]  # d: whole
    assert out.length_per_key() == [v.values().numel() for v in sent.values()]
    expansion = out.expansion
    for s, before, reverse in zip(SHARDINGS, expansion.features, expansion.reverse):
        assert before.keys() == s.features
        assert torch.equal(before.lengths(), torch.cat([kjt[f].lengths() for f in s.features]))
        # the rows come back in the order the sharding's KJT holds the ids: indexing them with
        # the reverse gives each position its own id's row
        assert torch.equal(_sharding_values(out, s.features)[reverse], _sharding_values(kjt, s.features))


def test_a_rank_without_samples_and_an_id_outside_its_table():
    empty = KeyedJaggedTensor(keys=KEYS, values=torch.zeros(0, dtype=torch.int64),
                              lengths=torch.zeros(0, dtype=torch.int32), stride=0)
    out = SequenceSourceDedup(SHARDINGS)(empty)
    assert out.values().numel() == 0 and [r.numel() for r in out.expansion.reverse] == [0, 0]
    for bad in (10, -1):
        seqs = {**SEQS, "c": [[3], [9, bad]]}
        with pytest.raises(ValueError, match=rf"id {bad} of feature c is outside its table's 10 rows"):
            SequenceSourceDedup(SHARDINGS)(_kjt(seqs))
    with pytest.raises(ValueError, match="already distinct"):  # its distinct ids are not a batch
        SequenceSourceDedup(SHARDINGS)(SequenceSourceDedup(SHARDINGS)(_kjt(SEQS)))


def test_the_expansion_moves_and_pins_with_its_kjt():
    out = SequenceSourceDedup(SHARDINGS)(_kjt(SEQS))
    moved = out.to(torch.device("cpu"))
    assert isinstance(moved, DistinctIdsKJT) and moved.length_per_key() == out.length_per_key()
    assert all(torch.equal(a, b) for a, b in zip(moved.expansion.reverse, out.expansion.reverse))
    if torch.cuda.is_available():  # pinning needs an accelerator
        assert isinstance(out.pin_memory().expansion.reverse[0], torch.Tensor)
