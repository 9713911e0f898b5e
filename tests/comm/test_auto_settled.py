"""`auto` settled on `none` (comm/auto/dist.py): the stock dist runs each step with auto's
forward not entered, auto steps back in only for the timed steps before each drift check,
still re-probes on drift, and its byte counters equal `none`'s (2 real Gloo ranks)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.comm.ranks import Scenario, Table, batch_for, build
from tests.comm.test_dedup_training import LOSS_RTOL
from tests.multiproc import run_ranks

STEPS = 45
DRIFT_FROM = 25  # from this step on every check sees drift
CHECK_EVERY = 10
SC = Scenario(tables=(Table("a", 10, 8, ("tw", 0)), Table("b", 12, 8, ("tw", 1)), Table("r", 40, 8, ("rw",))),
              batch=16, steps=STEPS, optimizer="sgd", lr=0.5)


def _settled_run(rank: int, world_size: int) -> dict:
    import torch

    from dlrmtrain.comm.auto.dist import AutoDist
    from dlrmtrain.comm.auto.policy import AutoPolicy
    from dlrmtrain.comm.stats import collect_comm_stats
    from dlrmtrain.comm.stock_bytes import count_stock_dists

    entered = {"n": 0}
    auto_forward = AutoDist.forward

    def counting_forward(self, *args, **kwargs):
        entered["n"] += 1
        return auto_forward(self, *args, **kwargs)

    AutoDist.forward = counting_forward  # class level: a settled AutoDist shadows it per instance
    out = {}
    for codec in ("none", "auto"):
        dmp, dense_opt, counters = build(SC, codec, world_size)
        if codec == "none":
            count_stock_dists(dmp, counters)
        dists = counters.of_type(AutoDist)
        stock_calls = {"n": 0}
        for d in dists:  # dedup can never win by 10000%: the decision is none
            d.policy = AutoPolicy(warmup_steps=1, probe_steps=2, min_probe_steps=2, margin=100.0, close_call_retimes=0,
                                  check_every=CHECK_EVERY, min_dwell=CHECK_EVERY, drift_samples=2,
                                  drift=1e9)  # no drift on a noisy machine until DRIFT_FROM
            d.stock_dist.register_forward_pre_hook(lambda *_: stock_calls.__setitem__("n", stock_calls["n"] + 1))
        trace, losses = [], []
        for step in range(STEPS):
            if step == DRIFT_FROM:
                for d in dists:
                    d.policy.drift = -1.0  # any step time counts as drift now
            before = (entered["n"], stock_calls["n"])
            kjt, labels = batch_for(SC, step, rank)
            dense_opt.zero_grad()
            loss, _ = dmp(kjt, labels)
            loss.backward()
            dense_opt.step()
            losses.append(loss.item())
            trace.append({"entered": entered["n"] - before[0], "stock": stock_calls["n"] - before[1],
                          "settled": [d.settled for d in dists],
                          "phase": [d.policy.phase for d in dists]})
        out[codec] = {"losses": losses, "trace": trace, "stats": collect_comm_stats(counters),
                      "decisions": [[(x.step, x.choice) for x in d.policy.decisions] for d in dists],
                      "n_dists": len(dists)}
        del dmp, dense_opt
    torch.distributed.barrier()
    return out


@pytest.mark.timeout(300)
def test_auto_settled_on_none_runs_the_stock_dist_and_still_rechecks_on_drift():
    for rank, res in enumerate(run_ranks(_settled_run, 2, timeout=280)):
        auto, none = res["auto"], res["none"]
        n = auto["n_dists"]
        assert n == 2, "one AutoDist per all-to-all (table- and row-wise)"
        trace = auto["trace"]
        decided = auto["decisions"][0][0][0]
        assert all(d[0] == (decided, "none") for d in auto["decisions"]), (rank, auto["decisions"])
        # settled steps: the stock dists ran, auto's forward was not entered
        settled = [i for i, t in enumerate(trace) if all(t["settled"])]
        assert settled, f"rank {rank}: never settled: {trace}"
        for i in settled[1:]:
            if all(trace[i - 1]["settled"]):  # a step wholly inside a settled run
                assert trace[i]["entered"] == 0 and trace[i]["stock"] == n, (rank, i, trace[i])
        # between the decision and the drift, auto is entered only around the checks
        steady = trace[decided + 1:DRIFT_FROM]
        entered_steps = sum(1 for t in steady if t["entered"])
        assert entered_steps <= 3 * (len(steady) // CHECK_EVERY + 1), (rank, steady)
        assert all(t["stock"] == n for t in trace[decided + 1:DRIFT_FROM]), "every step ran none"
        # drift: the next check re-probes (both paths again), then decides none again and settles
        for decisions in auto["decisions"]:
            assert len(decisions) >= 2 and {c for _, c in decisions} == {"none"}, (rank, decisions)
            assert DRIFT_FROM < decisions[1][0] <= DRIFT_FROM + CHECK_EVERY + 6, (rank, decisions)
        assert any("probe" in t["phase"] for t in trace[DRIFT_FROM:]), "no re-probe after drift"
        assert all(trace[-1]["settled"]) or any(all(t["settled"]) for t in trace[-6:])
        # lossless, and the settled steps' bytes are counted like none's
        np.testing.assert_allclose(auto["losses"], none["losses"], rtol=LOSS_RTOL)
        for name, counted in none["stats"]["tables"].items():
            got = auto["stats"]["tables"][name]
            for key in ("uncompressed_fwd_sent_bytes", "uncompressed_fwd_recv_bytes", "bags"):
                assert got[key] == counted[key], (rank, name, key, got[key], counted[key])


def _sequence_settled_run(rank: int, world_size: int) -> dict:
    import gc

    import torch

    from dlrmtrain.comm.auto.sequence import SequenceAutoDist
    from dlrmtrain.comm.stats import collect_comm_stats
    from dlrmtrain.config.schema import AutoConfig
    from tests.comm.sequence_ranks import SeqScenario, kjt_of, loss_of, probe_vectors, sequences_for, shard

    sc = SeqScenario(default_type="row_wise")
    # comm.auto through the run's sharder (build_ec_sharder); dedup 100x faster: never, on these tables
    auto = AutoConfig(warmup_steps=1, probe_steps=2, min_probe_steps=2, margin=0.99, close_call_retimes=0,
                      check_every=CHECK_EVERY, min_dwell=CHECK_EVERY, drift_samples=2, drift=1e9)
    dmp, _, counters = shard(sc, "auto", world_size, auto=auto)
    [d] = counters.of_type(SequenceAutoDist)
    assert all(getattr(d.policy, k) == v for k, v in vars(auto).items()), (d.policy, auto)
    probes, settled, positions = probe_vectors(), [], 0
    steps = 12
    for step in range(steps):
        seqs = sequences_for(sc, step, rank)
        positions += sum(len(s) for per_sample in seqs.values() for s in per_sample)
        out = dmp(kjt_of(seqs))
        out = out.wait() if hasattr(out, "wait") else out
        loss_of(out, sc.batch_of(rank), probes).backward()
        settled.append(d.settled)
    stats = collect_comm_stats(counters)
    torch.distributed.barrier()
    del dmp
    gc.collect()
    return {"settled": settled, "steps": stats["steps"], "forward_passes": steps, "positions": positions,
            "ids_looked_up": round(stats["ids_looked_up_per_step"] * stats["steps"]),
            "rows_looked_up": round(stats["rows_looked_up_per_step"] * stats["steps"])}


@pytest.mark.timeout(200)
def test_sequence_auto_settles_and_counts_every_pass():
    results = run_ranks(_sequence_settled_run, 2, timeout=180)
    for rank, res in enumerate(results):
        assert any(res["settled"]), (rank, res)
        assert res["steps"] == res["forward_passes"], (rank, res)  # settled passes counted too
    # row-wise, both paths: each position is looked up once by its row's owner, on every pass
    positions = sum(r["positions"] for r in results)
    assert sum(r["ids_looked_up"] for r in results) == sum(r["rows_looked_up"] for r in results) == positions
