"""The real checker on a simulated small run: derived rules accept it, official rules
reject it on exactly the accuracy target (and for dlrm_dcnv2 the eval size; for dlrmv4
every rule the derivation scales)."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from dlrmtrain.config import load_config
from dlrmtrain.mlperf.compliance import check_log
from dlrmtrain.mlperf.rules import RULESETS, DerivedRulesSpec
from dlrmtrain.mlperf.rules.derive import write_derived_rules
from dlrmtrain.mlperf_runner import dlrmv4_scale
from tests.mlperf.simulated_run import (
    EVAL_SAMPLES,
    OFFICIAL_DLRMV4,
    Dlrmv4Numbers,
    SimulatedRun,
    dlrmv4_config,
)

SMALL_TARGET = 0.75
DLRM_RULESETS = RULESETS["dlrm"]


def _derived(tmp_path, benchmark, ruleset, target=SMALL_TARGET):
    eval_samples = EVAL_SAMPLES if benchmark == "dlrm_dcnv2" else None
    return write_derived_rules(DerivedRulesSpec(benchmark, ruleset, target, eval_samples), tmp_path)


@pytest.mark.parametrize("ruleset", DLRM_RULESETS)
def test_dlrm_small_run_passes_derived_and_fails_official_only_on_target(tmp_path, ruleset):
    log = SimulatedRun("dlrm").write(tmp_path / "dlrm.log")

    derived = check_log(log, ruleset, _derived(tmp_path, "dlrm", ruleset))
    official = check_log(log, ruleset)

    assert derived.passed, derived.failures
    assert not derived.warnings
    assert official.failed_keys == {"eval_accuracy"}
    [failure] = official.failures
    assert ">= 0.8025" in failure.message


def test_dcnv2_small_run_passes_derived_and_fails_official_on_target_and_eval_size(tmp_path):
    log = SimulatedRun("dlrm_dcnv2").write(tmp_path / "dcnv2.log")

    derived = check_log(log, "6.0.0", _derived(tmp_path, "dlrm_dcnv2", "6.0.0"))
    official = check_log(log, "6.0.0")

    assert derived.passed, derived.failures
    assert official.failed_keys == {"eval_accuracy", "eval_samples"}
    messages = {f.key: f.message for f in official.failures}
    assert ">= 0.80275" in messages["eval_accuracy"]
    assert "89137319" in messages["eval_samples"]
    assert len(official.failures) == 2


# The rules a small dlrmv4 run breaks under the official ones: each holds a number the
# derivation replaces (the target, eval size, train samples and eval grid, sequence
# length, warmup, learning-rate band, eval spacing); nothing else.
DLRMV4_SCALED_RULES = {"train_samples", "eval_samples", "max_sequence_length",
                       "opt_learning_rate_warmup_steps", "opt_base_learning_rate",
                       "eval_every_data_pct", "eval_accuracy"}


def _dlrmv4_derived(tmp_path, numbers=Dlrmv4Numbers(), target=SMALL_TARGET):
    # The runner's own mapping from a run config to the derived rules' numbers.
    scale = dlrmv4_scale(dlrmv4_config(numbers), numbers.train_samples)
    return write_derived_rules(
        DerivedRulesSpec("dlrmv4", "6.1.0", target, numbers.eval_samples, scale), tmp_path)


def test_dlrmv4_small_run_passes_derived_and_fails_official_exactly_on_the_scaled_rules(tmp_path):
    log = SimulatedRun("dlrmv4").write(tmp_path / "v4.log")

    derived = check_log(log, "6.1.0", _dlrmv4_derived(tmp_path))
    official = check_log(log, "6.1.0")

    assert derived.passed, derived.failures
    assert not derived.warnings
    assert official.failed_keys == DLRMV4_SCALED_RULES
    messages = {f.key: f.message for f in official.failures}
    assert "== 4096" in messages["max_sequence_length"]
    assert "samples_count" in messages["eval_accuracy"]  # the full-size grid


@pytest.mark.parametrize("broken,failed", [
    (dict(aucs=(0.70, 0.74)), {"eval_accuracy"}),                  # below the target
    (dict(eval_shift_steps=1), {"eval_accuracy"}),                 # off the grid
    (dict(eval_shift_steps=-7), {"eval_accuracy"}),   # one grid point (7 steps) before the first
    (dict(config_changes={"model.hstu.max_seq_len": 128}), {"max_sequence_length"}),
    (dict(config_changes={"optim.grad_clip_norm": None}), {"opt_gradient_clip_norm"}),
    (dict(config_changes={"optim.name": "adagrad"}), {"opt_name", "opt_sparse_name"}),
])
def test_dlrmv4_derived_rules_still_hold_a_small_run_to_the_rest(tmp_path, broken, failed):
    rules = _dlrmv4_derived(tmp_path)  # for the unbroken numbers
    log = SimulatedRun("dlrmv4", **broken).write(tmp_path / "v4.log")
    assert check_log(log, "6.1.0", rules).failed_keys == failed


def test_the_full_size_config_logs_what_the_official_rules_accept(tmp_path):
    cfg = load_config(Path(__file__).parents[2] / "configs" / "mlperf_dlrmv4.yaml")
    if not hasattr(cfg.optim, "grad_clip_norm"):  # a schema before the dlrmv4 optimizer:
        o = cfg.optim                              # the config's comment states these
        o.name, o.adam_betas, o.adam_eps, o.grad_clip_norm = "adam", [0.95, 0.999], 1e-8, 1.0
    log = SimulatedRun("dlrmv4", aucs=(0.74, 0.7512), dlrmv4=OFFICIAL_DLRMV4,
                       eval_samples=OFFICIAL_DLRMV4.eval_samples, config=cfg).write(tmp_path / "f.log")
    result = check_log(log, "6.1.0")
    assert result.passed, result.failures
    values = {json.loads(line[9:])["key"]: json.loads(line[9:])["value"]
              for line in log.read_text().splitlines()}
    assert values["lowest_numerical_precision_in_linear"] == "bfloat16"  # precision.mode bf16
    assert values["micro_batch_size"] == 1024  # the reference's per-rank batch on 8 ranks


def test_run_below_the_derived_target_fails_derived_rules(tmp_path):
    log = SimulatedRun("dlrm", aucs=(0.70, 0.74)).write(tmp_path / "dlrm.log")
    result = check_log(log, "2.1.0", _derived(tmp_path, "dlrm", "2.1.0"))
    assert result.failed_keys == {"eval_accuracy"}


def test_dcnv2_log_with_another_eval_size_fails_derived_rules(tmp_path):
    log = SimulatedRun("dlrm_dcnv2", eval_samples=EVAL_SAMPLES + 1).write(tmp_path / "d.log")
    result = check_log(log, "6.0.0", _derived(tmp_path, "dlrm_dcnv2", "6.0.0"))
    assert result.failed_keys == {"eval_samples"}


@pytest.mark.parametrize("benchmark,ruleset", [("dlrm", "2.1.0"), ("dlrm_dcnv2", "6.0.0")])
def test_checker_cli_with_config_agrees(tmp_path, benchmark, ruleset):
    # The committed command line (--config with an absolute path) is what users run.
    good = SimulatedRun(benchmark).write(tmp_path / "good.log")
    bad = SimulatedRun(benchmark, aucs=(0.6, 0.7)).write(tmp_path / "bad.log")
    rules = _derived(tmp_path, benchmark, ruleset)
    for log, expect_pass in ((good, True), (bad, False)):
        result = check_log(log, ruleset, rules)
        assert result.passed is expect_pass
        cli = subprocess.run(shlex.split(result.command) + ["--log_output", str(tmp_path / "cc.log")],
                             capture_output=True, text=True, cwd=tmp_path)
        assert (cli.returncode == 0) is expect_pass, cli.stderr


def test_missing_log_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.log"):
        check_log(tmp_path / "nope.log", "2.1.0")
