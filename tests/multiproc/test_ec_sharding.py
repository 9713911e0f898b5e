"""Sharded sequence embeddings (DLRMv4's EmbeddingCollection) equal a single-process EC.

Two real Gloo ranks shard the EC (fused kernel, fused RowWiseAdagrad) row-wise
(the reference's default), table-wise, and mixed; a plain EC that sees both
ranks' batches, with RowWiseAdagrad written out by hand, is the reference.
Forward outputs are copies of table rows: bitwise equal. After each fused
step the tables equal the reference's to fp32 rounding (the gradient sums per
row come in another order).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.comm.sequence_ranks import SeqScenario, features, reference, train
from tests.multiproc import run_ranks

SCENARIOS = {
    "row_wise": SeqScenario(default_type="row_wise"),
    "table_wise": SeqScenario(default_type="table_wise"),
    "mixed": SeqScenario(default_type="table_wise",
                         sharding_tables={"item_id": "row_wise", "artist_id": "column_wise"}),
}
WORLD = 2


def _all_scenarios(rank: int, world_size: int) -> dict:
    return {name: train(sc, "none", rank, world_size) for name, sc in SCENARIOS.items()}


@pytest.fixture(scope="module")
def sharded():
    """One spawned 2-rank group runs every scenario (shared by the tests below)."""
    return run_ranks(_all_scenarios, WORLD, timeout=400)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_sharded_ec_forward_equals_single_process(sharded, name):
    sc = SCENARIOS[name]
    ref = reference(sc, WORLD)
    for step in range(sc.steps):
        for rank in range(WORLD):
            got, want = sharded[rank][name]["outputs"][step], ref["outputs"][step][rank]
            for f in features():
                if step == 0:
                    assert np.array_equal(got[f], want[f]), f"{name} rank {rank} {f}: forward differs"
                else:  # weights already moved by fused steps: fp32 rounding
                    np.testing.assert_allclose(got[f], want[f], rtol=1e-5, atol=1e-6, err_msg=f"{name} step {step} rank {rank} {f}")


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_fused_rowwise_adagrad_updates_rows_as_single_process(sharded, name):
    ref = reference(SCENARIOS[name], WORLD)
    tables = sharded[0][name]["tables"]
    assert set(tables) == set(ref["tables"])
    for t, w in ref["tables"].items():
        np.testing.assert_allclose(tables[t], w, rtol=1e-5, atol=1e-6, err_msg=f"{name}: table {t}")
    # the step really changed rows (the comparison is not between two untouched tables)
    initial = reference(SeqScenario(steps=0), WORLD)["tables"]
    assert any(not np.array_equal(initial[t], tables[t]) for t in tables)


def test_plan_text_names_the_sharding_types(sharded):
    assert "row_wise" in sharded[0]["row_wise"]["plan"] and "table_wise" not in sharded[0]["row_wise"]["plan"]
    mixed = sharded[0]["mixed"]["plan"]
    assert "row_wise" in mixed and "table_wise" in mixed and "column_wise" in mixed
