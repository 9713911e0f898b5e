"""The cost model behind docs/performance.md: its byte terms and its validation arithmetic."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"scripts_{name}", REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"scripts_{name}"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


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
