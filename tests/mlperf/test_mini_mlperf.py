"""configs/mini_mlperf.yaml on the real Criteo sample: its committed rules fit it, and a
real 2-rank run reaches the target, passes those rules and fails the official ones on the
target alone (every dlrm ruleset)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrmtrain.config import load_config
from dlrmtrain.mlperf.compliance import check_log
from dlrmtrain.mlperf.rules import (
    COMMITTED_SPECS,
    MINI_EVAL_SAMPLES,
    MINI_TARGET_AUC,
    RULESETS,
    committed_rules_path,
)
from dlrmtrain.mlperf_runner import expected_eval_samples
from tests.data.raw_rows import REPO_ROOT, shared_data_dir
from tests.common import train_on_rank
from tests.multiproc import run_ranks

CONFIG = REPO_ROOT / "configs" / "mini_mlperf.yaml"
SAMPLE = shared_data_dir() / "criteo_kaggle_sample.tsv.gz"

needs_sample = pytest.mark.skipif(not SAMPLE.is_file(),
                                  reason=f"real Criteo sample not found at {SAMPLE} "
                                         "(set DLRMTRAIN_SHARED_DATA)")


@pytest.fixture(scope="module")
def sample_dataset(tmp_path_factory) -> Path:
    from dlrmtrain.data.preprocess.pipeline import preprocess

    out = tmp_path_factory.mktemp("mini") / "criteo_kaggle_sample"
    preprocess([SAMPLE], out, "mlperf_vocab", progress=False)
    return out


@needs_sample
def test_committed_rules_match_the_config_and_its_eval_split(sample_dataset):
    cfg = load_config(CONFIG, [f"data.path={sample_dataset}"])
    assert cfg.eval.target_auc == MINI_TARGET_AUC
    assert expected_eval_samples(cfg) == MINI_EVAL_SAMPLES
    assert all(spec.target == MINI_TARGET_AUC for spec in COMMITTED_SPECS)


def _train(rank: int, world_size: int, config: str, overrides: list[str]) -> list[float]:
    return [e["auc"] for e in train_on_rank(rank, world_size, config, overrides)["evals"]]


@needs_sample
def test_a_real_mini_run_passes_the_committed_rules(sample_dataset, tmp_path):
    overrides = [f"data.path={sample_dataset}", f"run.output_dir={tmp_path}"]
    aucs, _ = run_ranks(_train, 2, str(CONFIG), overrides, timeout=300)
    assert max(aucs) >= MINI_TARGET_AUC, aucs
    log = tmp_path / "mini_mlperf" / "mlperf.log"
    for spec in COMMITTED_SPECS:
        if spec.benchmark != "dlrm":
            continue
        derived = check_log(log, spec.ruleset, committed_rules_path(spec))
        assert derived.passed, (spec.ruleset, derived.failures)
        assert check_log(log, spec.ruleset).failed_keys == {"eval_accuracy"}
    assert {s.ruleset for s in COMMITTED_SPECS if s.benchmark == "dlrm"} == set(RULESETS["dlrm"])
