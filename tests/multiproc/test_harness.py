"""The multi-rank harness itself: results come back by rank, and failures surface."""

import pytest
import torch
import torch.distributed as dist

from tests.multiproc import run_ranks


def _allreduce_rank(rank, world_size):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return t.item()


def _raise_on_rank_one(rank, world_size):
    if rank == 1:
        raise ValueError("boom on rank 1")
    return rank


def test_ranks_agree_on_allreduce():
    assert run_ranks(_allreduce_rank, 3) == [3.0, 3.0, 3.0]


def test_failing_rank_fails_the_run():
    with pytest.raises(RuntimeError, match="boom on rank 1"):
        run_ranks(_raise_on_rank_one, 2, timeout=60)
