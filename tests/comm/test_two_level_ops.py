"""The two-level planner's work per step does not grow with the number of tables.

Counted, not timed: the top-level aten ops (views and allocations apart, as
scripts/count_codec_ops.py counts them) issued inside `TwoLevelPlanner.plan` and
`TwoLevelPlan.complete` (stage 2's deferred plan) in one training step, on real
Gloo ranks (2 simulated nodes of 1 rank, comm.ranks_per_node on loopback), for 2
and for 8 one-hot tables per owner. The flat planner builds its indices from
whole-message ops (segment_units, expand_units); a two-level planner that builds
them table by table issues ops per (table, block) and falls behind it as tables are
added: at MLPerf's shape two-level / flat step time rose from 1.07-1.16 to 1.19-1.34
once the flat planner had lost its per-table ops and the two-level one had not.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from tests.comm.ranks import Scenario, Table, batch_for, build
from tests.multiproc import run_ranks
from dlrmtrain.comm.topology import Hierarchy

WORLD = 2
NODE = Hierarchy("node", 1)  # two nodes of one rank: every table's rows cross a rail
NO_KERNEL = frozenset({
    "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::slice", "aten::select", "aten::unsqueeze",
    "aten::squeeze", "aten::expand", "aten::as_strided", "aten::t", "aten::transpose", "aten::permute",
    "aten::unbind", "aten::split", "aten::alias", "aten::detach", "aten::view_as", "aten::narrow",
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::lift_fresh", "aten::resize_",
    "aten::_unsafe_view", "aten::contiguous", "aten::result_type", "aten::is_nonzero", "aten::item",
    "aten::_local_scalar_dense",
})


def _scenario(tables_per_rank: int) -> Scenario:
    return Scenario(tables=tuple(Table(f"t{r}_{k}", 20, 8, ("tw", r))
                                 for r in range(WORLD) for k in range(tables_per_rank)), batch=8, steps=3)


@contextlib.contextmanager
def _ranges():
    """`TwoLevelPlanner.plan` and `TwoLevelPlan.complete` each inside a profiler range `two_level::`,
    and the id exchange's launch (`start_node_ids`) in one of its own: it runs on this thread or on
    Gloo's, whichever completes its counts first, so it is left out of the count."""
    from dlrmtrain.comm.dedup.two_level import node_ids
    from dlrmtrain.comm.dedup.two_level.shared import TwoLevelPlan
    from dlrmtrain.comm.dedup.two_level.table_wise import TwoLevelPlanner

    real = {(TwoLevelPlanner, "plan"): TwoLevelPlanner.plan, (TwoLevelPlan, "complete"): TwoLevelPlan.complete,
            (node_ids, "start_node_ids"): node_ids.start_node_ids}

    def ranged(fn, label):
        def wrapper(*a, **k):
            with torch.profiler.record_function(f"two_level::{label}"):
                return fn(*a, **k)
        return wrapper

    for (owner, name), fn in real.items():
        setattr(owner, name, ranged(fn, name))
    try:
        yield
    finally:
        for (owner, name), fn in real.items():
            setattr(owner, name, fn)


def _top_level_ops(events) -> int:
    """Kernel-launching aten ops inside a `two_level::` range, not called by another aten op (nor
    by the id exchange's launch)."""
    count = 0
    for e in events:
        if not e.name.startswith("aten::") or e.name in NO_KERNEL:
            continue
        parent, ranges = e.cpu_parent, set()
        while parent is not None and not parent.name.startswith("aten::"):
            ranges.add(parent.name)
            parent = parent.cpu_parent
        inside = any(r.startswith("two_level::") for r in ranges) and "two_level::start_node_ids" not in ranges
        count += parent is None and inside
    return count


def _plan_ops(rank: int, world_size: int) -> dict[int, int]:
    out = {}
    with _ranges():
        for tables in (2, 8):
            sc = _scenario(tables)
            dmp, dense_opt, _ = build(sc, "dedup", world_size, NODE)
            for step in range(sc.steps):  # the last one counted: key widths learned by then
                kjt, labels = batch_for(sc, step, rank)
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                    dense_opt.zero_grad()
                    loss, _ = dmp(kjt, labels)
                    loss.backward()
                    dense_opt.step()
            out[tables] = _top_level_ops(prof.events())
            del dmp, dense_opt
    return out


@pytest.mark.timeout(240)
def test_two_level_plan_ops_do_not_grow_with_tables():
    for rank, ops in enumerate(run_ranks(_plan_ops, WORLD, timeout=220)):
        assert ops[2] > 0, (rank, ops)  # the ranges saw the planner
        assert ops[8] == ops[2], f"rank {rank}: two-level plan ops per step with 2 and 8 tables per rank: {ops}"
