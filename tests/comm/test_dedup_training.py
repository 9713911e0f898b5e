"""dedup vs TorchRec's stock all-to-all on real Gloo ranks (see ranks.py).

Tolerances (docs/design.md §4): the forward and the dense gradients of step 1 must
be bitwise equal; the embedding gradients differ only in float summation
order (rtol 1e-6); weights after step 1 within 4 ulp (of max(|w|, 0.01)), plus for Adagrad what
that gradient difference can move a weight (see `weight_tolerance`); losses over 10 steps
within rtol 1e-5 (ulp drift compounds, it does not grow systematically).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.comm.ranks import TWO_RANK_MIX, Scenario, Table, bags_for, compare
from tests.multiproc import run_ranks

LOSS_RTOL = 1e-5
GRAD_RTOL, GRAD_ATOL = 1e-6, 1e-9
MAX_ULPS = 4


def ulp_of(a: np.ndarray, b: np.ndarray, floor: float = 0.01) -> np.ndarray:
    """Per element, one float32 ulp of max(|a|, |b|, floor).

    The floor keeps weights that happen to sit near 0 from inflating the count:
    an optimizer step moves them by the same absolute rounding as any other.
    """
    return np.spacing(np.maximum(np.maximum(np.abs(a), np.abs(b)), floor).astype(np.float32))


def ulp_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Largest |a - b| in float32 ulps of max(|a|, |b|, 0.01)."""
    if a.size == 0:
        return 0.0
    return float((np.abs(a.astype(np.float64) - b) / ulp_of(a, b)).max())


def weight_tolerance(sc: Scenario) -> float:
    """Absolute weight difference after step 1 that a gradient difference of GRAD_RTOL allows.

    SGD moves a weight by lr·g, so rtol 1e-6 on g stays far below 4 ulp. Adagrad's first
    step moves it by lr·g/(|g|+eps): a relative change δ of g changes that by
    δ·|g|·eps/(|g|+eps)² ≤ δ/4 (largest at |g| = eps), i.e. up to lr·δ/4 — about 13 ulp
    of 0.01 at lr 0.05, whichever summation order the machine's kernels take.
    """
    return sc.lr * GRAD_RTOL / 4 if sc.optimizer == "adagrad" else 0.0


def expected_bytes(sc: Scenario, world_size: int, elem: int = 4) -> dict[int, dict[str, dict[str, int]]]:
    """Bytes each rank receives / sends forward, counted from the ids with plain Python sets.

    `elem`: bytes per value on the wire (4 for fp32; 2 for dedup stacked with fp16/bf16).
    """
    out = {r: {} for r in range(world_size)}
    for t in sc.tables:
        if t.placement[0] == "rw":
            for r in range(world_size):
                out[r][t.name] = _expected_row_wise(sc, t, r, world_size, elem)
            continue
        shard_ranks = [t.placement[1]] if t.placement[0] == "tw" else list(t.placement[1])
        shard_dim = t.dim // len(shard_ranks)
        coded = sc.table_codecs.get(t.name, "dedup") != "none"
        for r in range(world_size):
            recv = sent = ids = 0
            for step in range(sc.steps):
                own = bags_for(sc, step, r)[f"f_{t.name}"]
                # ids (int64) and lengths (int64) go to every shard owner
                ids += (sum(len(b) for b in own) + len(own)) * 8 * len(shard_ranks)
                def n_rows(rank: int) -> int:
                    bags = bags_for(sc, step, rank)[f"f_{t.name}"]
                    return len({tuple(b) for b in bags}) if coded else len(bags)
                recv += n_rows(r) * t.dim * elem
                sent += sum(n_rows(s) for s in range(world_size)) * shard_dim * elem * shard_ranks.count(r)
            out[r][t.name] = {"recv": recv, "sent": sent, "ids": ids}
    return out


def _expected_row_wise(sc: Scenario, t, r: int, world_size: int, elem: int) -> dict[str, int]:
    """Row-wise under dedup: distinct ids received from their shards; owner r sends those in its block."""
    block = -(-t.rows // world_size)
    recv = sent = ids = 0
    for step in range(sc.steps):
        own = bags_for(sc, step, r)[f"f_{t.name}"]
        ids += (sum(len(b) for b in own) + world_size * len(own)) * 8  # every shard gets every length
        recv += len({b[0] for b in own if b}) * t.dim * elem
        for s in range(world_size):
            theirs = bags_for(sc, step, s)[f"f_{t.name}"]
            sent += len({b[0] for b in theirs if b and b[0] // block == r}) * t.dim * elem
    return {"recv": recv, "sent": sent, "ids": ids}


def check(sc: Scenario, world_size: int, results: list[dict]) -> None:
    expected = expected_bytes(sc, world_size)
    for rank, res in enumerate(results):
        none, dedup = res["none"], res["dedup"]
        # forward of step 1: bitwise equal pooled embeddings
        assert np.array_equal(none["pooled"], dedup["pooled"]), f"rank {rank}: forward differs"
        # TorchRec's compute() + output_dist() entry gives the same output
        assert np.array_equal(dedup["split_path_pooled"], none["pooled"])
        assert np.array_equal(none["split_path_pooled"], none["pooled"])
        # dense (MLP) gradients of step 1: bitwise
        assert none["dense_grads"].keys() == dedup["dense_grads"].keys() and none["dense_grads"]
        for name, g in none["dense_grads"].items():
            assert np.array_equal(g, dedup["dense_grads"][name]), f"rank {rank}: {name} grad differs"
        # gradients reaching the embedding backward, per table row
        assert len(none["emb_grads"]) == len(dedup["emb_grads"])
        for per_sharding_n, per_sharding_d in zip(none["emb_grads"], dedup["emb_grads"]):
            for gn, gd in zip(per_sharding_n, per_sharding_d):
                np.testing.assert_allclose(gd, gn, rtol=GRAD_RTOL, atol=GRAD_ATOL)
        # weights after the first fused optimizer step
        assert none["weights_after_1"].keys() == dedup["weights_after_1"].keys()
        for key, w in none["weights_after_1"].items():
            wd = dedup["weights_after_1"][key]
            beyond_ulps = np.abs(w.astype(np.float64) - wd) - MAX_ULPS * ulp_of(w, wd)
            assert w.size == 0 or beyond_ulps.max() <= weight_tolerance(sc), (
                f"rank {rank}: {key} differs by {ulp_distance(w, wd)} ulp after step 1")
        # short training: losses track none
        np.testing.assert_allclose(dedup["losses"], none["losses"], rtol=LOSS_RTOL)
        # bytes on the wire = sum of U·D·4, counted independently
        tables = dedup["stats"]["tables"]
        for t in sc.tables:
            got = tables[t.name]
            want = expected[rank][t.name]
            assert got["payload_fwd_recv_bytes"] == want["recv"], (rank, t.name, got, want)
            assert got["payload_fwd_sent_bytes"] == want["sent"], (rank, t.name, got, want)
            assert got["payload_bwd_sent_bytes"] == want["recv"]
            # a reduce-scatter brings every rank's partial sums; an all-to-all one copy
            copies = world_size if t.placement[0] == "rw" else 1
            assert got["uncompressed_fwd_recv_bytes"] == copies * sc.steps * sc.batch * t.dim * 4
            assert got["codec"] == sc.table_codecs.get(t.name, "dedup")
            assert got["id_sent_bytes"] == want["ids"], (rank, t.name, got, want)
            everyone = dedup["stats_all_ranks"]["tables"][t.name]
            assert everyone["payload_fwd_recv_bytes"] == sum(e[t.name]["recv"] for e in expected.values())
            # what all owners sent is what all sample ranks received
            assert everyone["payload_fwd_sent_bytes"] == everyone["payload_fwd_recv_bytes"]
            assert everyone["id_sent_bytes"] == everyone["id_recv_bytes"]
        assert none["stats"]["tables"] == {}  # none is TorchRec's stock dist: no codec counters


@pytest.mark.timeout(300)
def test_one_hot_table_and_column_wise_sgd():
    sc = Scenario(tables=(
        *TWO_RANK_MIX,
        Table("d", 20, 16, ("tw", 0)),  # mixed dims: 8-column units
    ), batch=16, steps=10, optimizer="sgd", lr=0.5)
    check(sc, 2, run_ranks(compare, 2, sc, timeout=280))


@pytest.mark.timeout(300)
def test_multi_hot_bags_adagrad():
    sc = Scenario(tables=(
        Table("m3", 30, 8, ("tw", 1), bag=3),
        Table("m5", 40, 16, ("cw", (1, 0)), bag=5),
        Table("m1", 10, 8, ("tw", 0)),
        Table("m2", 25, 8, ("tw", 0), ids="missing", bag=2),
    ), batch=16, steps=10, optimizer="adagrad", lr=0.05)
    check(sc, 2, run_ranks(compare, 2, sc, timeout=280))


@pytest.mark.timeout(300)
def test_edge_cases_world_size_3():
    # rank 2 owns no table; every id equal; every id distinct; a block with no
    # values at all; missing values; jagged bags (the key width must grow); and
    # a per-table override back to none inside a dedup all-to-all
    sc = Scenario(tables=(
        Table("equal", 10, 8, ("tw", 0), ids="equal"),
        Table("distinct", 64, 8, ("tw", 1), ids="distinct"),
        Table("empty", 10, 8, ("tw", 0), ids="empty_on_rank1"),
        Table("missing", 10, 16, ("cw", (0, 1)), ids="missing"),
        Table("jagged", 10, 8, ("tw", 1), ids="jagged"),
        Table("plain", 10, 8, ("tw", 1)),
    ), batch=8, steps=3, table_codecs={"plain": "none"})
    results = run_ranks(compare, 3, sc, timeout=280)
    check(sc, 3, results)
    for rank, res in enumerate(results):
        tables = res["dedup"]["stats"]["tables"]
        assert tables["equal"]["unique_bags"] == sc.steps  # one row per step
        assert tables["distinct"]["unique_bags"] == sc.steps * sc.batch
        assert tables["plain"]["payload_fwd_recv_bytes"] == tables["plain"]["uncompressed_fwd_recv_bytes"]
    # jagged bags are longer than the initial key width: both ends widened it
    assert results[1]["dedup"]["stats"]["extra_syncs"] >= 1
    assert results[2]["dedup"]["stats"]["tables"]["jagged"]["payload_fwd_sent_bytes"] == 0  # owns nothing
