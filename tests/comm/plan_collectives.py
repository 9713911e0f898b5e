"""What the row-wise dedup plan launches, counted inside real spawned ranks (tests/comm/test_dedup_row_wise.py).

Every torch.distributed collective is wrapped to count its calls (the calls
themselves go through untouched): those made while a row-wise planner's
`plan` runs, and the flags' all-reduces launched with the ids
(`row_wise.start_row_flags`). The plan must launch none.
"""

from __future__ import annotations

import functools

import torch.distributed as dist

from tests.comm.ranks import Scenario, compare

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_to_all", "all_to_all_single",
               "broadcast", "reduce_scatter", "reduce_scatter_tensor", "barrier", "all_gather_object",
               "broadcast_object_list")


def _counting(owner, name: str, on_call) -> None:
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        on_call()
        return fn(*args, **kwargs)
    setattr(owner, name, wrapper)


def compare_counting_plan_collectives(rank: int, world_size: int, sc: Scenario) -> dict:
    """`ranks.compare`, plus the collectives launched inside row-wise plans and with the ids."""
    from dlrmtrain.comm.dedup import row_wise

    counts = {"plan_collectives": 0, "flags_launched": 0, "plans": 0}
    inside = [0]

    def collective():
        if inside[0]:
            counts["plan_collectives"] += 1

    for name in COLLECTIVES:
        _counting(dist, name, collective)
    if hasattr(row_wise, "start_row_flags"):  # absent before the flags left with the ids
        _counting(row_wise, "start_row_flags",
                  lambda: counts.__setitem__("flags_launched", counts["flags_launched"] + 1))
    plan = row_wise.RowWisePlanner.plan

    def counted_plan(self, step):
        counts["plans"] += 1
        inside[0] += 1
        try:
            return plan(self, step)
        finally:
            inside[0] -= 1
    row_wise.RowWisePlanner.plan = counted_plan
    return {**compare(rank, world_size, sc), **counts}
