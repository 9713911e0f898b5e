"""GPU-readiness, checked on CPU: each codec dist costs exactly one host sync per step
(the all-to-all split sizes) and hands back a real awaitable with the transfer in flight;
the comm stats count the same. (Under the pipeline the plan, and its sync, move off the
step: test_plan_ahead.py.)

Syncs are counted with HostSyncCounter (sync_counter.py): every call from
dlrmtrain/comm/ that would sync on a GPU, forward and backward of whole
training steps. The first step may add one more (the key width learned for
multi-hot bags); one-hot steps must not.
"""

from __future__ import annotations

import pytest

from tests.comm.ranks import TWO_RANK_MIX, Scenario, Table, count_host_syncs
from tests.multiproc import run_ranks


@pytest.mark.timeout(300)
@pytest.mark.parametrize("codec", ["dedup", "dedup+fp16"])
def test_one_host_sync_per_dist_per_step(codec: str):
    sc = Scenario(tables=(
        *TWO_RANK_MIX,
        Table("r", 11, 8, ("rw",)),
    ), batch=8, steps=3, id_range=10)
    for rank, res in enumerate(run_ranks(count_host_syncs, 2, sc, codec, timeout=280)):
        dists = res["dists"]
        assert dists == 3  # table-wise, column-wise, row-wise
        for step, syncs in enumerate(res["per_step"]):
            assert [name for name, _ in syncs] == ["tolist"] * dists, (rank, step, syncs)
        assert res["counted_per_step"] == dists
        assert res["awaitables"] == ["DedupAwaitable"] * dists
        assert res["works"] and all("Work" in w for w in res["works"])
        # stream-safe (issue 26 item 3): record_stream reaches every tensor of each plan and every
        # tensor the codec left in the sharding contexts (sample features, row-wise flags); the
        # awaited output is recorded on the caller's stream as TorchRec's comm_ops.Request does
        assert [missed for _, missed in res["plans_unrecorded"]] == [0] * dists
        assert all(found > 0 for found, _ in res["plans_unrecorded"])
        found, missed = res["ctx_unrecorded"]
        assert found > 0 and missed == 0
        assert res["awaited_recorded"] == [True] * dists
        # the wait half may run on another stream than the start: what the request holds (its
        # receive buffers and plan) is recorded on the waiting stream before it is read
        assert all(found > 0 and missed == 0 for found, missed in res["request_unrecorded"])
