"""The dedup planners issue the same number of ops per step at any world size (issue 26, item 5).

One process: a planner for rank 0 of a W-rank layout plans one step from real
KJTs (each rank owning the same number of tables, the same per-rank batch),
under the torch profiler; its top-level aten ops are counted at W = 2 and 8.
Before the index building was batched, table-wise issued ops per (rank,
entry) and row-wise per (rank, feature). scripts/count_codec_ops.py counts
the same on real multi-rank training runs.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.comm.dedup.plan import DedupStep
from dlrmtrain.comm.dedup.row_wise import RowWisePlanner
from dlrmtrain.comm.dedup.table_wise import TableWisePlanner
from dlrmtrain.comm.layout import DistLayout, FeatureEntry, RowWiseLayout
from dlrmtrain.comm.stats import DistCommStats

B, ROWS, DIM = 32, 50, 8


def _kjt(keys: list[str], stride: int, ids: torch.Tensor, lengths: torch.Tensor) -> KeyedJaggedTensor:
    return KeyedJaggedTensor(keys=keys, values=ids, lengths=lengths, stride=stride)


def _bags(features: int, bags: int, bag: int, high: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, high, (features * bags * bag,), generator=g),
            torch.full((features * bags,), bag, dtype=torch.int64))


def _step(owner: KeyedJaggedTensor, sample: KeyedJaggedTensor, world: int, started=None) -> DedupStep:
    return DedupStep(owner, sample, [B] * world, 0, torch.device("cpu"), 4, 4,
                     DistCommStats(codec="dedup", sharding_type="test"), started)


def _top_level_ops(fn) -> int:
    fn()  # warm: key widths learned
    with torch.profiler.profile() as prof:
        fn()
    return sum(1 for e in prof.events() if e.name.startswith("aten::")
               and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))


def _table_wise_ops(world: int, bag: int) -> int:
    per_rank = [[FeatureEntry(f"f{r}_{k}", f"t{r}_{k}", DIM, ROWS) for k in range(2)] for r in range(world)]
    layout = DistLayout(per_rank)
    planner = TableWisePlanner(layout, {e.table for e in layout.all_entries()}, rank=0)
    owner_ids, owner_lengths = _bags(2, world * B, bag, ROWS, seed=world)
    sample_ids, sample_lengths = _bags(2 * world, B, bag, ROWS, seed=world + 1)
    owner = _kjt([e.feature for e in per_rank[0]], world * B, owner_ids, owner_lengths)
    sample = _kjt([e.feature for e in layout.all_entries()], B, sample_ids, sample_lengths)
    return _top_level_ops(lambda: planner.plan(_step(owner, sample, world)))


def _row_wise_ops(world: int) -> int:
    entries = [FeatureEntry(f"f{k}", f"t{k}", DIM, ROWS * world) for k in range(3)]
    layout = RowWiseLayout(entries, [ROWS] * 3, world)
    planner = RowWisePlanner(layout, dist.group.WORLD, rank=0)
    owner_ids, lengths = _bags(3, world * B, 1, ROWS, seed=world)  # ids of rank 0's row block
    sample_ids, sample_lengths = _bags(3, B, 1, ROWS * world, seed=world + 1)
    owner = _kjt([e.feature for e in entries], world * B, owner_ids, lengths)
    sample = _kjt([e.feature for e in entries], B, sample_ids, sample_lengths)

    def plan():  # the flags leave with the ids (a real all-reduce over this process's world of one)
        assert planner.plan(_step(owner, sample, world, planner.start_with_ids(sample))) is not None
    return _top_level_ops(plan)


def test_table_wise_plan_ops_do_not_grow_with_the_world_size():
    for bag in (1, 3):  # one-hot and multi-hot blocks (one sort per width, not per block or column)
        assert _table_wise_ops(2, bag) == _table_wise_ops(8, bag)


def test_row_wise_plan_ops_do_not_grow_with_the_world_size():
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert _row_wise_ops(2) == _row_wise_ops(8)
    finally:
        if started:
            dist.destroy_process_group()
