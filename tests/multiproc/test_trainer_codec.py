"""comm.codec reaches the trainer: dedup trains like none and reports its bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.multiproc import run_ranks
from tests.multiproc.test_train_ranks import _train

RUN = ["run.max_steps=8", "eval.evals_per_epoch=0"]


@pytest.mark.parametrize("extra", [[], ["run.pipeline=true", "sharding.default_type=column_wise"]],
                         ids=["table_wise", "pipelined_column_wise"])
def test_dedup_tracks_none_in_the_trainer(tmp_path, extra):
    none, _ = run_ranks(_train, 2, str(tmp_path), RUN + extra + ["run.name=none"], timeout=240)
    dedup, _ = run_ranks(_train, 2, str(tmp_path),
                         RUN + extra + ["run.name=dedup", "comm.codec=dedup"], timeout=240)
    # The forward is bitwise; gradients differ by summation order only.
    assert dedup["losses"][0] == none["losses"][0]
    assert [l for _, l in dedup["losses"]] == pytest.approx([l for _, l in none["losses"]],
                                                            rel=1e-5)
    assert dedup["final_auc"] == pytest.approx(none["final_auc"], abs=1e-3)
    stats = json.loads((Path(tmp_path) / "dedup" / "comm_stats.json").read_text())
    assert stats["tables"] and all(t["codec"] == "dedup" for t in stats["tables"].values())
    # none names itself and counts what TorchRec's stock dist moved: dedup's "uncompressed"
    plain = json.loads((Path(tmp_path) / "none" / "comm_stats.json").read_text())
    assert plain["codecs"] == ["none"] and plain["payload_ratio_vs_none"] == 1.0
    assert plain["total"]["payload_fwd_recv_bytes"] == stats["total"]["uncompressed_fwd_recv_bytes"]
