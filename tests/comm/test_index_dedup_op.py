"""The CPU kernel of `fbgemm::jagged_unique_indices` (torchrec_hooks.py), against outputs worked
out by hand from fbgemm 1.8's CUDA kernel (linearize by each feature's table base, sorted
unique with inverse, each table's distinct ids spread evenly over its features × batch slots),
and the TorchRec call it serves (`ShardedEmbeddingCollection._dedup_indices`)."""

from __future__ import annotations

import inspect

import pytest
import torch

from dlrmtrain.comm import torchrec_hooks as hooks

# two tables as TorchRec lays them out for one sharding: A (10 rows) serves features a0, a1;
# B (5 rows) serves b. Per feature its table's base: [0, 0, 10], then the total 15.
CUMSUM = torch.tensor([0, 0, 10, 15])
GROUPS = torch.tensor([0, 2, 3])  # features of each table: a0, a1 | b


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])


def _run(lengths: list[int], ids: list[int], cumsum=CUMSUM, groups=GROUPS):
    hooks.register_cpu_jagged_unique_indices()
    out = torch.ops.fbgemm.jagged_unique_indices(cumsum, groups, _offsets(lengths), torch.tensor(ids))
    return [t.tolist() for t in out], [t.dtype for t in out]


def test_shared_table_features_share_their_distinct_ids_and_the_counts_spread_evenly():
    # batch 2; a0: [3, 3] [7]; a1: [3] [1, 9]; b: [] [4, 4, 0]
    (lengths, offsets, unique, reverse), dtypes = _run([2, 1, 1, 2, 0, 3], [3, 3, 7, 3, 1, 9, 4, 4, 0])
    assert unique == [1, 3, 7, 9, 0, 4]           # sorted by (table base + id)
    assert reverse == [1, 1, 2, 1, 0, 3, 5, 5, 4]  # each id's place among them
    assert lengths == [1, 1, 1, 1, 1, 1]           # A: 4 distinct over 4 slots; B: 2 over 2
    assert offsets == [0, 1, 2, 3, 4, 5, 6]
    assert dtypes == [torch.int64] * 4


def test_remainder_goes_to_the_first_slots_and_an_empty_table_gets_zeros():
    # A: 5 distinct ids over its 4 slots -> 2, 1, 1, 1; B sees none
    (lengths, _offsets_, unique, reverse), _ = _run([3, 0, 2, 0, 0, 0], [0, 1, 2, 8, 9])
    assert lengths == [2, 1, 1, 1, 0, 0] and unique == [0, 1, 2, 8, 9] and reverse == [0, 1, 2, 3, 4]


def test_every_id_the_same():
    (lengths, offsets, unique, reverse), _ = _run([3, 2, 1, 0, 2, 2], [6] * 6 + [2] * 4)
    assert unique == [6, 2] and reverse == [0] * 6 + [1] * 4
    assert lengths == [1, 0, 0, 0, 1, 0] and offsets == [0, 1, 1, 1, 1, 2, 2]


def test_no_ids_at_all_and_a_rank_without_samples():
    (lengths, offsets, unique, reverse), _ = _run([0] * 6, [])
    assert lengths == [0] * 6 and offsets == [0] * 7 and unique == [] and reverse == []
    (lengths, offsets, unique, reverse), _ = _run([], [])  # batch 0: no slots
    assert lengths == [] and offsets == [0] and unique == [] and reverse == []


@pytest.mark.parametrize("bad", [10, -1])
def test_an_id_outside_its_table_is_refused_not_moved_to_a_neighbour(bad):
    # linearized, id 10 of table A would read row 0 of table B, and -1 of B row 9 of A
    with pytest.raises(ValueError, match=rf"id {bad} of feature \d of its sharding is outside its table's"):
        _run([1, 0, 0, 0, 0, 0] if bad == 10 else [0, 0, 0, 0, 1, 0], [bad])


def test_registering_twice_is_one_kernel_and_cuda_stays_fbgemms():
    hooks.register_cpu_jagged_unique_indices()
    hooks.register_cpu_jagged_unique_indices()
    assert len(hooks._CPU_KERNELS) == 1
    assert torch._C._dispatch_has_kernel_for_dispatch_key("fbgemm::jagged_unique_indices", "CPU")


def test_torchrec_still_calls_the_op_as_the_kernel_expects():
    """The hook point: TorchRec 1.8's `_dedup_indices` passes (cumsum, offsets per table, the KJT's
    int64 offsets and values) and reads (lengths, offsets, unique, reverse) back."""
    from torchrec.distributed.embedding import ShardedEmbeddingCollection

    schema = str(torch.ops.fbgemm.jagged_unique_indices.default._schema)
    assert schema == ("fbgemm::jagged_unique_indices(Tensor hash_size_cumsum, Tensor hash_size_offsets, "
                      "Tensor offsets, Tensor indices) -> (Tensor, Tensor, Tensor, Tensor)")
    src = inspect.getsource(ShardedEmbeddingCollection._dedup_indices)
    assert "torch.ops.fbgemm.jagged_unique_indices(" in src
    for read in ("lengths=lengths", "offsets=offsets", "values=unique_indices", "ctx.reverse_indices.append"):
        assert read in src, read
    assert "self._use_index_dedup" in inspect.getsource(ShardedEmbeddingCollection.input_dist)
