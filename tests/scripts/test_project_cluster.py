"""The cost model behind docs/performance.md: its byte terms and its validation arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.scripts import load_script

REPO = Path(__file__).resolve().parents[2]


load = load_script


def test_dense_params_are_mlperf_v1s():
    pc = load("project_cluster")
    assert pc.dense_params() == ((13 * 512 + 512) + (512 * 256 + 256) + (256 * 128 + 128)
                                 + (479 * 1024 + 1024) + (1024 * 1024 + 1024) + (1024 * 512 + 512)
                                 + (512 * 256 + 256) + (256 + 1))


@pytest.mark.parametrize("gpus", [8, 64, 512])
def test_all_to_all_bytes_split_by_node_and_shrink_under_dedup(gpus):
    pc = load("project_cluster")
    none = pc.a2a_bytes_per_gpu("DLRM v1", gpus, "none")
    dedup = pc.a2a_bytes_per_gpu("DLRM v1", gpus, "dedup")
    local = pc.GLOBAL_BATCH["DLRM v1"] // gpus
    assert sum(none) == pytest.approx(2 * local * 26 * 128 * 4 * (gpus - 1) / gpus)
    assert (none[1] == 0) is (gpus <= pc.GPUS_PER_NODE)  # one node: all on NVLink
    assert 0 < sum(dedup) < sum(none)


def test_validation_error_is_zero_when_the_measurement_follows_the_model():
    pc = load("project_cluster")
    comm = {"world_size": 2, "none": {"payload": 100e6, "ids": 1e6},
            "dedup": {"payload": 25e6, "ids": 1e6}}
    shared = 1e6 + 2 * pc.dense_params() * 4
    compute, codec, lo = 4.0, 0.1, 17e9 / 8

    def point(link, gbit):
        shaped = 0.0 if gbit is None else 1.0 / (gbit * 1e9 / 8)
        none = compute + (100e6 + shared) * (1 / lo + shaped)
        dedup = compute + codec + (25e6 + shared) * (1 / lo + shaped)
        p = {"link": link, "ms_per_step": {"dlrmtrain": 1e3 * none, "dlrmtrain comm.codec=dedup": 1e3 * dedup}}
        if gbit is None:  # the dedup contender's own codec time, as bench_train counts it
            p["codec_ms_per_step"] = {"dlrmtrain": 0.0, "dlrmtrain comm.codec=dedup": 1e3 * codec}
        return p
    sweep = {"mlperf": [point("unshaped", None), point("1", 1.0), point("0.5", 0.5)]}
    rows = pc.validate(sweep, comm, (25.0, 25.0, 25.0), loopback_gbit=17.0)
    assert rows[0]["codec_ms_kernels"] == pytest.approx(100.0)  # two uniques + expand + segment-sum
    assert [r["link"] for r in rows] == ["unshaped", "1", "0.5"]
    for r in rows:  # all variants: codec from the kernels (100 ms), fitted, counted in the run
        assert r["error"] == pytest.approx(0.0, abs=1e-9)
        assert r["fitted_error"] == pytest.approx(0.0, abs=1e-9)
        assert r["counted_error"] == pytest.approx(0.0, abs=1e-9)
    assert rows[2]["predicted_ratio"] < rows[1]["predicted_ratio"] < rows[0]["predicted_ratio"]


def test_bench_link_ratios_are_against_none_and_plain():
    bl = load("bench_link")
    point = {"ms_per_step": {"dlrmtrain": 200.0, "dlrmtrain comm.codec=dedup": 150.0,
                             "plain TorchRec DMP": 250.0}}
    assert bl.ratios(point, ["dedup"]) == pytest.approx(
        {"dedup": 0.75, "none/plain": 0.8, "dedup/plain": 0.6})


# ------------------------------------------------------------------ two levels
TINY = ([4, 10, 1000], [0.0, 0.0, 0.0])  # uniform ids: U(b) = n (1 - (1 - 1/n)^b) by hand


def hand_distinct(n, b):
    return n * (1 - (1 - 1 / n) ** b)


def test_node_level_distinct_fraction_is_at_most_one_level_and_falls_with_ranks_per_node():
    pc = load("project_cluster")
    assert pc.node_distinct_ratio(*TINY, 1, 64) == pytest.approx(1.0)
    ratios = [pc.node_distinct_ratio(*TINY, L, 64) for L in (2, 4, 8)]
    assert all(r <= 1.0 for r in ratios) and ratios == sorted(ratios, reverse=True)
    hand = sum(hand_distinct(n, 4 * 64) for n in TINY[0]) / (4 * sum(hand_distinct(n, 64) for n in TINY[0]))
    assert ratios[1] == pytest.approx(hand, rel=1e-6)
    for model in ("DLRM v1", "DCNv2"):  # the projection's own profiles
        assert pc.node_distinct_ratio(*pc.model_profile(model), 8, 864) < 1.0


def test_measured_node_ratio_counts_distinct_ids_per_node_block():
    pc = load("project_cluster")
    # one node block of 2 ranks x 2 samples, two tables; then a second block
    ids = np.array([[0, 5], [1, 5], [0, 5], [2, 6],
                    [3, 7], [3, 7], [3, 8], [4, 9]])
    # block 1: table 0 node {0,1,2}=3 vs ranks 2+2; table 1 node {5,6}=2 vs 1+2
    # block 2: table 0 node {3,4}=2 vs 1+2;      table 1 node {7,8,9}=3 vs 1+2
    assert pc.measured_node_ratio(ids, 2, 2) == pytest.approx((3 + 2 + 2 + 3) / (4 + 3 + 3 + 3))
    with pytest.raises(ValueError, match="fewer than one node block"):
        pc.measured_node_ratio(ids[:3], 2, 2)


@pytest.mark.parametrize("gpus", [64, 512])
def test_two_level_bytes_between_nodes_match_a_hand_computation(gpus):
    pc = load("project_cluster")
    local, L = pc.GLOBAL_BATCH["DLRM v1"] // gpus, pc.GPUS_PER_NODE
    nodes = gpus // L
    intra, inter = pc.a2a_bytes_per_gpu("DLRM v1", gpus, "two-level", profile=TINY)
    row = pc.DIM * 4
    # each table's node-unique rows reach each of the N - 1 other nodes, forward and back
    assert inter == pytest.approx(2 * row * (nodes - 1) / gpus * sum(hand_distinct(n, L * local) for n in TINY[0]),
                                  rel=1e-6)
    _, inter_dedup = pc.a2a_bytes_per_gpu("DLRM v1", gpus, "dedup", profile=TINY)
    assert inter_dedup == pytest.approx(2 * row * (gpus - L) / gpus * sum(hand_distinct(n, local) for n in TINY[0]),
                                        rel=1e-6)
    assert inter / inter_dedup == pytest.approx(pc.node_distinct_ratio(*TINY, L, local), rel=1e-6)
    # inside the node: each rank's own distinct rows from its node's forwarder, plus the id exchange
    ids = 2 * len(TINY[0]) * local * 8 * (L - 1) / L
    assert intra == pytest.approx(2 * row * (L - 1) / L * sum(hand_distinct(n, local) for n in TINY[0]) + ids,
                                  rel=1e-6)


def test_two_levels_send_n_minus_1_messages_between_nodes_not_w_minus_1():
    pc = load("project_cluster")
    assert pc.messages_per_gpu(64, "none") == (2 * 7, 2 * 56)       # forward + backward, every peer
    assert pc.messages_per_gpu(64, "dedup") == (2 * 7, 2 * 56)
    assert pc.messages_per_gpu(64, "two-level") == (4 * 7, 2 * 7)   # rail: the 7 other nodes
    assert pc.messages_per_gpu(512, "two-level")[1] == 2 * 63
    assert pc.messages_per_gpu(8, "two-level") == pc.messages_per_gpu(8, "dedup")  # one node: one level


def test_projection_two_level_falls_back_on_one_node_and_auto_never_loses():
    pc = load("project_cluster")
    rows = pc.project()
    assert {r["auto_path"] for r in rows} <= set(pc.CODECS)
    for r in rows:
        assert r["speedup_auto"] >= 1.0
        assert r["auto_ms"] == min(r["none_ms"], r["dedup_ms"], r["two_level_ms"])
        if r["gpus"] <= pc.GPUS_PER_NODE:
            assert r["two_level_ms"] == pytest.approx(r["dedup_ms"])
        else:  # fewer messages and no more bytes between nodes than one level
            assert r["two_level_messages"] < r["dedup_messages"]
            assert r["two_level_inter_mb"] <= r["dedup_inter_mb"]


def test_node_validation_error_is_zero_when_the_measurement_follows_the_model(tmp_path):
    pc = load("project_cluster")
    overrides = ["model.bottom_mlp=[64,128]", "model.top_mlp=[64,1]"]
    computed = pc.sim_bytes_between_nodes(4, 2, 8192, pc.DIM, "kaggle", [64, 128], [64, 1])
    assert computed["two-level"] < computed["dedup"] < computed["none"]
    unshaped = {"none": 900.0, "dedup": 950.0, "two-level": 1000.0}

    def point(gbit):
        extra = 0.0 if gbit is None else 1.0 / (2 * gbit * 1e9 / 8)  # two nodes, each its own link
        return {"link": "unshaped" if gbit is None else f"{gbit:g}",
                "ms_per_step": {name: unshaped[c] + 1e3 * computed[c] * extra
                                for c, name in pc.NODE_CONTENDERS.items()},
                "loopback_mb_per_step": {name: computed[c] / 1e6 for c, name in pc.NODE_CONTENDERS.items()}}
    (tmp_path / "sweep.json").write_text(json.dumps({"mlperf": [point(None), point(2), point(1), point(0.5)]}))
    (tmp_path / "mlperf_unshaped.json").write_text(json.dumps(
        {"world_size": 4, "sim_nodes": 2, "global_batch_size": 8192, "overrides": overrides}))
    rows = pc.validate_nodes(pc.load_node_sweep(tmp_path))
    assert [r["link"] for r in rows] == ["2", "1", "0.5"]
    for r in rows:
        assert r["worst_time_error"] == pytest.approx(0.0, abs=1e-9)
        for label in ("dedup/none", "two-level/dedup", "two-level/none"):
            assert r[label]["error"] == pytest.approx(0.0, abs=1e-9)
            assert r[label]["counted_error"] == pytest.approx(0.0, abs=1e-9)
    assert rows[2]["two-level/none"]["predicted"] < rows[0]["two-level/none"]["predicted"]


def test_node_sweep_without_the_two_level_contender_is_refused(tmp_path):
    pc = load("project_cluster")
    (tmp_path / "sweep.json").write_text(json.dumps(
        {"mlperf": [{"link": "unshaped", "ms_per_step": {"dlrmtrain": 1.0, "dlrmtrain comm.codec=dedup": 1.0}}]}))
    (tmp_path / "mlperf_unshaped.json").write_text(json.dumps(
        {"world_size": 4, "sim_nodes": 2, "global_batch_size": 8192}))
    with pytest.raises(ValueError, match="two-level"):
        pc.load_node_sweep(tmp_path)


def test_bench_link_prints_two_level_against_one_level():
    bl = load("bench_link")
    point = {"ms_per_step": {"dlrmtrain": 200.0, "dlrmtrain comm.codec=dedup": 150.0,
                             "dlrmtrain comm.codec=dedup comm.hierarchy=node": 120.0}}
    r = bl.ratios(point, ["dedup", bl.TWO_LEVEL])
    assert r["two-level/dedup"] == pytest.approx(0.8)
    assert r["dedup"] == pytest.approx(0.75)
