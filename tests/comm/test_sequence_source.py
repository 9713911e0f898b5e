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


def _distinct_by_one_sort(s, lengths, values, B):
    """The transform's distinct ids as it made them before comm/dedup/unique.py: one
    torch.unique over table · span + id keys (the oracle for the counting pass)."""
    from dlrmtrain.comm.dedup.sequence_source import _spread
    tables = list(dict.fromkeys(s.tables))
    span = max(s.rows.values()) + 1
    counts = [v.numel() for v in values]
    ids = torch.cat(values).to(torch.int64)
    table = torch.repeat_interleave(torch.tensor([tables.index(t) for t in s.tables]), torch.tensor(counts))
    uniq, inverse = torch.unique(table * span + ids, sorted=True, return_inverse=True)
    per_table = torch.bincount(uniq // span, minlength=len(tables)).tolist()
    taken = {t: sum(per_table[:i]) for i, t in enumerate(tables)}
    slices, out = [], {}
    for f, (feature, t) in enumerate(zip(s.features, s.tables)):
        n_features, j = s.tables.count(t), s.tables[:f].count(t)
        slot_lengths = _spread(per_table[tables.index(t)], n_features * B)[j * B:(j + 1) * B]
        n, first = int(slot_lengths.sum()), taken[t]
        taken[t] += n
        slices.append(torch.arange(first, first + n))
        out[feature] = (slot_lengths.to(lengths[f].dtype), (uniq[first:first + n] % span).to(values[f].dtype))
    order = torch.cat(slices)
    row_of = torch.empty_like(order)
    row_of[order] = torch.arange(order.numel())
    return out, row_of[inverse]


@pytest.mark.parametrize("dtypes", [(torch.int64, torch.int64), (torch.int32, torch.int32)])
def test_the_kjt_and_reverse_are_the_full_sorts_bitwise(monkeypatch, dtypes):
    # long histories over small tables (ids repeat: the counting pass runs) beside a feature
    # of few ids over many rows (the sort runs), tables shared by features, row-wise too
    from dlrmtrain.comm.dedup import sequence_source
    shardings = [ShardingFeatures("table_wise", ["a", "b", "c"], ["T", "U", "T"], {"T": 3000, "U": 10 ** 8}),
                 ShardingFeatures("row_wise", ["e"], ["W"], {"W": 2 ** 31 - 1}),
                 ShardingFeatures("column_wise", ["d"], ["V"], {"V": 4})]
    g = torch.Generator().manual_seed(0)
    B, keys = 24, ["c", "d", "a", "e", "b"]
    lengths = {"a": torch.randint(0, 400, (B,), generator=g), "c": torch.randint(0, 300, (B,), generator=g),
               "b": torch.ones(B, dtype=torch.int64), "d": torch.randint(0, 3, (B,), generator=g),
               "e": torch.randint(150, 250, (B,), generator=g)}
    lengths["c"][3] = 0  # an empty sequence
    rows = {"a": 3000, "c": 3000, "b": 10 ** 8, "d": 4, "e": 2 ** 31 - 1}
    values = {k: torch.randint(0, rows[k], (int(lengths[k].sum()),), generator=g) for k in keys}
    values["e"] = values["e"] % 5000 + (2 ** 31 - 5001)  # near the largest id
    values["a"][-1] = 2999  # a table's largest row
    kjt = KeyedJaggedTensor(keys=keys, values=torch.cat([values[k] for k in keys]).to(dtypes[0]),
                            lengths=torch.cat([lengths[k] for k in keys]).to(dtypes[1]), stride=B)
    new = SequenceSourceDedup(shardings)(kjt)
    monkeypatch.setattr(sequence_source, "_distinct", _distinct_by_one_sort)
    old = SequenceSourceDedup(shardings)(kjt)
    for got, want in [(new, old), *zip(new.expansion.features, old.expansion.features)]:
        assert got.keys() == want.keys() and got.length_per_key() == want.length_per_key()
        for a, b in ((got.values(), want.values()), (got.lengths(), want.lengths())):
            assert a.dtype == b.dtype and torch.equal(a, b)
    for a, b in zip(new.expansion.reverse, old.expansion.reverse):
        assert a.dtype == b.dtype and torch.equal(a, b)
