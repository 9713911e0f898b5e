"""comm.codec reaches the trainer: dedup trains like none and reports its bytes."""

from __future__ import annotations

import json

import pytest

from tests.multiproc import ranks_once_per_module
from tests.multiproc.test_train_ranks import _train

RUN = ["run.max_steps=8", "eval.evals_per_epoch=0"]


LAYOUTS = {"table_wise": [], "pipelined_column_wise": ["run.pipeline=true",
                                                      "sharding.default_type=column_wise"]}


SOURCE = {"none_sgd": ["comm.codec=none"], "source": ["comm.codec=dedup"],
          "auto_source_pipelined": ["comm.codec=auto", "comm.dedup_at=source", "run.pipeline=sparse_dist"]}
"""comm.dedup_at: source (left unset: `dedup` resolves to it on this path; SGD: fbgemm's variable-batch
TBE does not train Adagrad), `auto` choosing
per step between it and none (pipelined: its picks run ahead; the plain loop's, the same code with
none in flight, in tests/comm/test_auto_source.py), and their none; column-wise tables and an eval,
through the loader's prefetch thread"""


SOURCE_RUN = ["eval.evals_per_epoch=1", "optim.name=sgd", "optim.lr=0.5", "sharding.default_type=column_wise"]

ACROSS = [["run.max_steps=2", "comm.dedup_at=owner"],
          ["run.max_steps=4", "comm.dedup_at=source", "checkpoint.resume=true"],
          ["run.max_steps=6", "comm.dedup_at=owner", "checkpoint.resume=true"]]
"""one run checkpointed under dedup at the owner, resumed under source, and back"""


def _none_and_dedup(rank: int, world_size: int, out_dir: str) -> dict:
    """Every (layout, codec) run in one spawned group (a spawn costs as much as a run);
    the none runs first, so that no dedup run came before them in this process."""
    runs = {(layout, codec): _train(rank, world_size, f"{out_dir}/{layout}",
                                    RUN + extra + [f"run.name={codec}", f"comm.codec={codec}",
                                                          "comm.dedup_at=owner"])
            for codec in ("none", "dedup") for layout, extra in LAYOUTS.items()}
    for name, extra in SOURCE.items():
        runs["source", name] = _train(rank, world_size, f"{out_dir}/source",
                                      ["run.max_steps=6", *SOURCE_RUN, f"run.name={name}", *extra])
    runs["source", "across"] = [_train(rank, world_size, f"{out_dir}/source", [
        *SOURCE_RUN, "eval.enabled=false", "run.name=across", "comm.codec=dedup", "checkpoint.at_end=true", *leg])
        for leg in ACROSS]
    return runs


trained = ranks_once_per_module(_none_and_dedup, "codec", timeout=400)


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


def test_dedup_at_the_source_trains_like_none_in_the_trainer(trained):
    """comm.codec=dedup with comm.dedup_at unset (issue 33: the default) dedups at the source
    on SGD column-wise tables, and the run folder's config records the value taken."""
    runs, out = trained
    from dlrmtrain.config.loader import load_config

    assert load_config(out / "source" / "source" / "config.yaml", []).comm.dedup_at == "source"
    none, source = runs["source", "none_sgd"], runs["source", "source"]
    assert source["losses"][0] == none["losses"][0]  # the first forward is bitwise
    assert [l for _, l in source["losses"]] == pytest.approx([l for _, l in none["losses"]], rel=1e-5)
    assert source["final_auc"] == pytest.approx(none["final_auc"], abs=1e-3)
    stats = json.loads((out / "source" / "source" / "comm_stats.json").read_text())
    plain = json.loads((out / "source" / "none_sgd" / "comm_stats.json").read_text())
    assert stats["codecs"] == ["dedup"] and stats["steps"] == plain["steps"]  # eval passes too
    # only distinct bags are sent and looked up; none's every bag
    assert stats["ids_sent_per_step"] < plain["ids_sent_per_step"]
    assert stats["rows_looked_up_per_step"] == stats["rows_sent_per_step"] < plain["rows_sent_per_step"]
    assert plain["rows_looked_up_per_step"] == plain["rows_sent_per_step"]
    assert stats["total"]["payload_fwd_recv_bytes"] < plain["total"]["payload_fwd_recv_bytes"]


def test_a_run_resumes_across_dedup_at_owner_and_source(trained):
    """Issue 33, 4: `comm.dedup_at` changes only where the distinct bags are found (the tables and
    their optimizer state are the same), so a run checkpointed under owner resumes under source
    and back, and trains on as an uninterrupted run does; the resumed records say so."""
    runs, out = trained
    legs, none = runs["source", "across"], runs["source", "none_sgd"]
    assert [leg["steps"] for leg in legs] == [2, 4, 6], legs
    losses = [loss for leg in legs for loss in leg["losses"]]
    assert [s for s, _ in losses] == list(range(1, 7))
    assert [l for _, l in losses] == pytest.approx([l for _, l in none["losses"]], rel=1e-5)
    records = [json.loads(x) for x in (out / "source" / "across" / "metrics.jsonl").read_text().splitlines()]
    markers = [r["codec_changes"] for r in records if r["kind"] == "resumed"]
    assert markers == [{"comm.dedup_at": ["owner", "source"]}, {"comm.dedup_at": ["source", "owner"]}]


@pytest.mark.parametrize("name", ["auto_source_pipelined"])
def test_auto_at_the_source_takes_both_forms_and_trains_like_none(trained, name):
    """comm.codec auto with comm.dedup_at: source, pipelined: each step takes
    the full batch or its distinct bags (the loader made both); over its first steps it times both,
    so what it sent lies between none's and source's, and every step trains as none's."""
    runs, out = trained
    none, auto = runs["source", "none_sgd"], runs["source", name]
    assert auto["losses"][0] == none["losses"][0]
    assert [l for _, l in auto["losses"]] == pytest.approx([l for _, l in none["losses"]], rel=1e-5)
    assert auto["final_auc"] == pytest.approx(none["final_auc"], abs=1e-3)
    stats = {run: json.loads((out / "source" / run / "comm_stats.json").read_text())
             for run in ("none_sgd", "source", name)}
    assert stats[name]["codecs"] == ["auto"]
    ids = {run: s["ids_sent_per_step"] for run, s in stats.items()}
    assert ids["source"] < ids[name] < ids["none_sgd"], ids
