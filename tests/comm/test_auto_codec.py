"""`auto` on real Gloo ranks: lossless like dedup, one decision agreed by every rank; none's byte counters.

`auto` alternates dedup (first) and none while it probes, then keeps one; every
step must give what `none` gives: step 1 (dedup path) forward and dense
gradients bitwise, losses over the probe and past the decision within the
tolerance `dedup` meets (test_dedup_training.py). Which path wins on these tiny
tables depends on the machine's timing, so the test asserts that every rank
took the same decision, not which.
"""

from __future__ import annotations

import numpy as np
import pytest

from dlrmtrain.comm.auto.policy import AutoPolicy
from tests.comm.ranks import TWO_RANK_MIX, Scenario, Table, compare_counted
from tests.comm.test_dedup_training import LOSS_RTOL
from tests.multiproc import run_ranks

STEPS = AutoPolicy().warmup_steps + 2 * AutoPolicy().probe_steps + 4  # past the first decision


@pytest.mark.timeout(400)
def test_auto_is_lossless_and_ranks_agree_and_none_counts_its_bytes():
    sc = Scenario(tables=(
        *TWO_RANK_MIX,
        Table("r", 40, 8, ("rw",)),
    ), batch=16, steps=STEPS, optimizer="sgd", lr=0.5)
    results = run_ranks(compare_counted, 2, sc, ("none", "dedup", "auto"), timeout=380)
    decisions = []
    for rank, res in enumerate(results):
        none, dedup, auto = res["none"], res["dedup"], res["auto"]
        # step 1 runs auto's dedup path: bitwise the forward of none
        assert np.array_equal(none["pooled"], auto["pooled"]), f"rank {rank}: auto forward differs"
        assert np.array_equal(none["split_path_pooled"], auto["split_path_pooled"])
        for name, g in none["dense_grads"].items():
            assert np.array_equal(g, auto["dense_grads"][name]), f"rank {rank}: {name} grad differs"
        np.testing.assert_allclose(auto["losses"], none["losses"], rtol=LOSS_RTOL)
        np.testing.assert_allclose(dedup["losses"], none["losses"], rtol=LOSS_RTOL)
        stats = auto["stats"]
        assert stats["auto_decisions"], "auto never decided"
        decisions.append(stats["auto_decisions"])
        assert all(t["codec"] in ("auto:none", "auto:dedup") for t in stats["tables"].values())
        assert "  auto:" in auto["summary"] and "\n  auto: " in auto["summary"]  # codec rows, the decision
        # none's counters (around TorchRec's untouched dist) = what dedup and auto call uncompressed
        counted = none["stats"]["tables"]
        assert set(counted) == {t.name for t in sc.tables}
        for t in sc.tables:
            got = counted[t.name]
            assert got["codec"] == "none"
            for other in (dedup, auto):
                o = other["stats"]["tables"][t.name]
                assert got["payload_fwd_recv_bytes"] == o["uncompressed_fwd_recv_bytes"], (rank, t.name)
                assert got["payload_fwd_sent_bytes"] == o["uncompressed_fwd_sent_bytes"], (rank, t.name)
                assert got["uncompressed_fwd_recv_bytes"] == got["payload_fwd_recv_bytes"]
        assert none["stats"]["payload_ratio_vs_none"] == 1.0
        assert "\n  none " in none["summary"] and "ratio to none (fwd+bwd) 1.00x" in none["summary"]
        assert dedup["stats"]["payload_ratio_vs_none"] > 1.0
    assert all(d == decisions[0] for d in decisions), f"ranks decided differently: {decisions}"
