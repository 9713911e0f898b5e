"""comm.codec reaches the trainer: dedup trains like none and reports its bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.multiproc import run_ranks
from tests.multiproc.test_train_ranks import _train

RUN = ["run.max_steps=8", "eval.evals_per_epoch=0"]


LAYOUTS = {"table_wise": [], "pipelined_column_wise": ["run.pipeline=true",
                                                      "sharding.default_type=column_wise"]}


def _none_and_dedup(rank: int, world_size: int, out_dir: str) -> dict:
    """Every (layout, codec) run in one spawned group (a spawn costs as much as a run);
    the none runs first, so that no dedup run came before them in this process."""
    return {(layout, codec): _train(rank, world_size, f"{out_dir}/{layout}",
                                    RUN + extra + [f"run.name={codec}", f"comm.codec={codec}"])
            for codec in ("none", "dedup") for layout, extra in LAYOUTS.items()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("codec")
    rank0, _ = run_ranks(_none_and_dedup, 2, str(out), timeout=400)
    return rank0, out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_dedup_tracks_none_in_the_trainer(trained, layout):
    runs, out = trained
    none, dedup = runs[layout, "none"], runs[layout, "dedup"]
    root = out / layout
    # The forward is bitwise; gradients differ by summation order only.
    assert dedup["losses"][0] == none["losses"][0]
    assert [l for _, l in dedup["losses"]] == pytest.approx([l for _, l in none["losses"]],
                                                            rel=1e-5)
    assert dedup["final_auc"] == pytest.approx(none["final_auc"], abs=1e-3)
    stats = json.loads((root / "dedup" / "comm_stats.json").read_text())
    assert stats["tables"] and all(t["codec"] == "dedup" for t in stats["tables"].values())
    # none names itself and counts what TorchRec's stock dist moved: dedup's "uncompressed"
    plain = json.loads((root / "none" / "comm_stats.json").read_text())
    assert plain["codecs"] == ["none"] and plain["payload_ratio_vs_none"] == 1.0
    assert plain["total"]["payload_fwd_recv_bytes"] == stats["total"]["uncompressed_fwd_recv_bytes"]
