"""Every sharding type trains like table-wise: same model, same data, same losses
up to float summation order."""

from __future__ import annotations

import pytest

from tests.multiproc import run_ranks
from tests.multiproc.test_train_ranks import _train

STEPS = ["run.max_steps=4", "eval.enabled=false"]


def _losses(tmp_path, name, overrides):
    rank0, _ = run_ranks(_train, 2, str(tmp_path / name), STEPS + overrides, timeout=180)
    return [loss for _, loss in rank0["losses"]]


@pytest.fixture(scope="module")
def table_wise_losses(tmp_path_factory):
    return _losses(tmp_path_factory.mktemp("tw"), "tw", ["sharding.default_type=table_wise"])


@pytest.mark.parametrize("overrides", [
    ["sharding.default_type=column_wise"],
    ["sharding.default_type=row_wise"],
    ["sharding.default_type=data_parallel"],
    # A mix, as a real plan would use: big tables row-wise, tiny ones replicated.
    ["sharding.tables={t_cat_2: row_wise, t_cat_15: column_wise, t_cat_5: data_parallel, "
     "t_cat_8: data_parallel}"],
], ids=["column_wise", "row_wise", "data_parallel", "mixed"])
def test_matches_table_wise(tmp_path, table_wise_losses, overrides):
    losses = _losses(tmp_path, "x", overrides)
    assert losses == pytest.approx(table_wise_losses, rel=1e-5, abs=1e-6)
    assert losses[0] != losses[-1]


def test_torchrec_planner_honours_the_per_table_choices(tmp_path):
    overrides = ["sharding.planner=torchrec",
                 "sharding.tables={t_cat_0: column_wise, t_cat_5: data_parallel}"]
    rank0, _ = run_ranks(_train, 2, str(tmp_path), STEPS + overrides, timeout=180)
    plan = (tmp_path / "dlrm" / "plan.txt").read_text()
    kinds = {line.split()[0]: line.split()[1] for line in plan.splitlines()[1:]}
    assert kinds["t_cat_0"] == "column_wise" and kinds["t_cat_5"] == "data_parallel"
    assert set(kinds.values()) == {"table_wise", "column_wise", "data_parallel"}
    assert len(rank0["losses"]) == 4


def test_explicit_table_ranks_are_used(tmp_path):
    overrides = ["sharding.table_ranks={t_cat_0: 1, t_cat_1: 1, t_cat_2: 0}"]
    run_ranks(_train, 2, str(tmp_path), STEPS + overrides, timeout=180)
    plan = (tmp_path / "dlrm" / "plan.txt").read_text()
    ranks = {line.split()[0]: line.split("ranks")[-1].strip() for line in plan.splitlines()[1:]}
    assert (ranks["t_cat_0"], ranks["t_cat_1"], ranks["t_cat_2"]) == ("[1]", "[1]", "[0]")
