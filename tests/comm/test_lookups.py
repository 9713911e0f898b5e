"""comm/lookups.py's `LookupCounter` on a fixed-batch KJT whose per-key lengths are not on the
host (TorchRec's id all-to-all syncs them today, so the ranks' tests never reach this branch):
a column-wise feature's later shards add no ids and no bags, and the ids are summed on the
lengths' device until the counters are read."""

from __future__ import annotations

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.comm.lookups import LookupCounter


def _kjt() -> KeyedJaggedTensor:
    # a (first shard), b, a (a later shard of a's table); stride 2
    return KeyedJaggedTensor(keys=["a", "b", "a"], values=torch.arange(9), lengths=torch.tensor([1, 2, 0, 1, 1, 1]))


def test_unsynced_lengths_count_ids_of_first_shards_only_when_read():
    kjt = _kjt()
    assert kjt.length_per_key_or_none() is None  # the device branch
    counter = LookupCounter("column_wise", [("a", True), ("b", True), ("a", False)])
    for _ in range(2):
        counter(None, (kjt,))
    assert counter.comm_stats.ids_looked_up == 0  # nothing read back yet
    stats = counter.counted_bytes()
    assert (stats.ids_looked_up, stats.rows_looked_up, stats.steps) == (2 * (3 + 1), 2 * (2 + 2), 2)
    assert counter.counted_bytes().ids_looked_up == 8  # read once


def test_synced_lengths_give_the_same_counts():
    counter = LookupCounter("column_wise", [("a", True), ("b", True), ("a", False)])
    counter(None, (_kjt().sync(),))
    assert (counter.counted_bytes().ids_looked_up, counter.comm_stats.rows_looked_up) == (4, 4)
