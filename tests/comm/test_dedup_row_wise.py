"""Row-wise sharding under dedup: an all-to-all of unique rows replaces TorchRec's reduce-scatter.

Same checks and tolerances as test_dedup_training.py (forward and dense
gradients bitwise, embedding gradients up to summation order, losses rtol
1e-5, bytes counted independently from the ids), on row-wise tables next to a
table-wise one; plus the fallback to the stock reduce-scatter for multi-id bags.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.comm.plan_collectives import compare_counting_plan_collectives
from tests.comm.ranks import Scenario, Table, compare
from tests.comm.test_dedup_training import check
from tests.multiproc import run_ranks


@pytest.mark.timeout(300)
def test_row_wise_one_hot_tracks_none_sgd():
    sc = Scenario(tables=(
        Table("r1", 11, 8, ("rw",)),                   # uneven last block (6 + 5 rows)
        Table("r2", 20, 16, ("rw",), ids="missing"),   # empty bags read zeros
        Table("r3", 10, 8, ("rw",), ids="equal"),
        Table("t", 12, 8, ("tw", 1)),
    ), batch=16, steps=6, optimizer="sgd", lr=0.5, id_range=10)
    results = run_ranks(compare_counting_plan_collectives, 2, sc, timeout=280)
    check(sc, 2, results)
    for res in results:
        # the plan launches no collective: the flags every rank agrees on left with the ids
        assert res["plans"] >= sc.steps and res["plan_collectives"] == 0
        assert res["flags_launched"] >= res["plans"]
        stats = res["dedup"]["stats"]
        assert stats["fallback_steps"] == 0
        assert stats["tables"]["r3"]["unique_bags"] == sc.steps  # one id per step, one shard sends it
        assert stats["tables"]["r1"]["codec"] == "dedup"


@pytest.mark.timeout(300)
def test_row_wise_world_size_3_adagrad():
    sc = Scenario(tables=(
        Table("r1", 30, 8, ("rw",), ids="distinct"),
        Table("r2", 9, 16, ("rw",)),
        Table("c", 10, 16, ("cw", (0, 2))),
    ), batch=8, steps=3, optimizer="adagrad", lr=0.05, id_range=9)
    check(sc, 3, run_ranks(compare, 3, sc, timeout=280))


@pytest.mark.timeout(300)
def test_multi_id_bags_fall_back_to_the_reduce_scatter():
    # bags of 3 ids may span shards: every step must run TorchRec's reduce-scatter
    sc = Scenario(tables=(Table("m", 20, 8, ("rw",), bag=3), Table("t", 10, 8, ("tw", 0))),
                  batch=8, steps=3, id_range=10)
    results = run_ranks(compare_counting_plan_collectives, 2, sc, timeout=280)
    for res in results:
        assert res["plans"] >= sc.steps and res["plan_collectives"] == 0  # fell back on flags sent with the ids
        none, dedup = res["none"], res["dedup"]
        assert np.array_equal(none["pooled"], dedup["pooled"])
        assert dedup["losses"] == pytest.approx(none["losses"], rel=1e-6)
        assert dedup["stats"]["fallback_steps"] == sc.steps
        assert "reduce-scatter" in dedup["summary"]
        assert "m" not in dedup["stats"]["tables"]  # nothing went through the codec
