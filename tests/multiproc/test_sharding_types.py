"""Every sharding type trains like table-wise: same model, same data, same losses
up to float summation order. One spawned 2-rank group trains every scenario (a spawn
and its imports cost more than these 4-step runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.multiproc import run_ranks
from tests.multiproc.test_train_ranks import _train

STEPS = ["run.max_steps=4", "eval.enabled=false"]
SCENARIOS = {
    "table_wise": ["sharding.default_type=table_wise"],
    "column_wise": ["sharding.default_type=column_wise"],
    "row_wise": ["sharding.default_type=row_wise"],
    "data_parallel": ["sharding.default_type=data_parallel"],
    # A mix, as a real plan would use: big tables row-wise, tiny ones replicated.
    "mixed": ["sharding.tables={t_cat_2: row_wise, t_cat_15: column_wise, t_cat_5: data_parallel, "
              "t_cat_8: data_parallel}"],
    "torchrec_planner": ["sharding.planner=torchrec",
                         "sharding.tables={t_cat_0: column_wise, t_cat_5: data_parallel}"],
    "table_ranks": ["sharding.table_ranks={t_cat_0: 1, t_cat_1: 1, t_cat_2: 0}"],
}


def _every_scenario(rank: int, world_size: int, out_dir: str) -> dict[str, list[float]]:
    return {name: [loss for _, loss in
                   _train(rank, world_size, str(Path(out_dir) / name), STEPS + overrides)["losses"]]
            for name, overrides in SCENARIOS.items()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[dict[str, list[float]], Path]:
    """(rank 0's losses by scenario, the folder holding each scenario's run directory)."""
    out = tmp_path_factory.mktemp("sharding")
    rank0, _ = run_ranks(_every_scenario, 2, str(out), timeout=400)
    return rank0, out


def _plan(out: Path, scenario: str) -> list[str]:
    return (out / scenario / "dlrm" / "plan.txt").read_text().splitlines()[1:]


@pytest.mark.parametrize("name", ["column_wise", "row_wise", "data_parallel", "mixed"])
def test_matches_table_wise(trained, name):
    losses, out = trained
    assert losses[name] == pytest.approx(losses["table_wise"], rel=1e-5, abs=1e-6)
    assert losses[name][0] != losses[name][-1]
    kinds = {line.split()[1] for line in _plan(out, name)}
    assert name in kinds or name == "mixed"  # the type asked for was the type used


def test_torchrec_planner_honours_the_per_table_choices(trained):
    losses, out = trained
    kinds = {line.split()[0]: line.split()[1] for line in _plan(out, "torchrec_planner")}
    assert kinds["t_cat_0"] == "column_wise" and kinds["t_cat_5"] == "data_parallel"
    assert set(kinds.values()) == {"table_wise", "column_wise", "data_parallel"}
    assert len(losses["torchrec_planner"]) == 4


def test_explicit_table_ranks_are_used(trained):
    _, out = trained
    ranks = {line.split()[0]: line.split("ranks")[-1].strip() for line in _plan(out, "table_ranks")}
    assert (ranks["t_cat_0"], ranks["t_cat_1"], ranks["t_cat_2"]) == ("[1]", "[1]", "[0]")
