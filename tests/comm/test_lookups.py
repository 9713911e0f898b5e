"""comm/lookups.py's `LookupCounter` reads each feature's id count on the host: TorchRec's id
all-to-all hands the lookup a KJT whose per-key lengths are already there (`dist_init` ends with
`sync()`), so counting adds no host sync; a column-wise feature's later shards add no ids and no
bags (whole rows, once per table)."""

from __future__ import annotations

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.comm.lookups import LookupCounter


def _kjt() -> KeyedJaggedTensor:
    # a (first shard), b, a (a later shard of a's table); stride 2
    return KeyedJaggedTensor(keys=["a", "b", "a"], values=torch.arange(9), lengths=torch.tensor([1, 2, 0, 1, 1, 1]))


def test_the_id_all_to_all_hands_the_lookup_host_lengths():
    """What the counter relies on; if TorchRec stops syncing here, counting would sync instead."""
    kjt = _kjt()
    for variable in (False, True):
        tensors = [kjt.lengths(), kjt.values()] + ([torch.tensor([2, 2, 2])] if variable else [])
        received = KeyedJaggedTensor.dist_init(keys=kjt.keys(), tensors=tensors, variable_stride_per_key=variable,
                                               num_workers=1, recat=None, stride_per_rank=[2])
        assert received.length_per_key_or_none() == [3, 1, 2], variable


def test_later_column_shards_add_no_ids_and_no_bags():
    counter = LookupCounter("column_wise", [("a", True), ("b", True), ("a", False)])
    for _ in range(2):
        counter(None, (_kjt().sync(),))
    stats = counter.counted_bytes()
    assert (stats.ids_looked_up, stats.rows_looked_up, stats.steps) == (2 * (3 + 1), 2 * (2 + 2), 2)


def test_a_lookup_in_another_order_is_refused_not_miscounted():
    counter = LookupCounter("column_wise", [("b", True), ("a", True), ("a", False)])
    with pytest.raises(ValueError, match=r"its layout has \['b', 'a', 'a'\]"):
        counter(None, (_kjt().sync(),))
