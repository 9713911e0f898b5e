"""Derived rules are the official rules with only the target and eval size changed."""

from __future__ import annotations

import pytest
import yaml

from dlrmtrain.mlperf.compliance import check_log
from dlrmtrain.mlperf.rules import (
    COMMITTED_SPECS,
    OFFICIAL_EVAL_SAMPLES,
    OFFICIAL_TARGET,
    RULESETS,
    DerivedRulesSpec,
    committed_rules_path,
)
from dlrmtrain.mlperf.rules.derive import derive_rules_text, write_derived_rules
from tests.mlperf.simulated_run import SimulatedRun

ALL = [(b, r) for b, rulesets in RULESETS.items() for r in rulesets]


def _variants(benchmark):
    """Logs that meet the official numbers, each broken in one way (or not at all)."""
    size = int(OFFICIAL_EVAL_SAMPLES.get(benchmark, 1024))
    good = dict(aucs=(0.79, 0.8031), eval_samples=size)
    wrong_hp = ({"sgd_opt_learning_rate_decay_poly_power": 3} if benchmark == "dlrm"
                else {"opt_adagrad_epsilon": 1e-6})
    return {
        "good": SimulatedRun(benchmark, **good),
        "below_target": SimulatedRun(benchmark, aucs=(0.79, 0.80), eval_samples=size),
        "wrong_hyperparameter": SimulatedRun(benchmark, hyperparameter_overrides=wrong_hp, **good),
        "no_weights_initialization": SimulatedRun(benchmark, skip_weights=True, **good),
        "other_eval_size": SimulatedRun(benchmark, aucs=good["aucs"], eval_samples=size - 1),
    }


@pytest.mark.parametrize("benchmark,ruleset", ALL)
def test_derived_with_official_numbers_judges_like_the_official_rules(tmp_path, benchmark, ruleset):
    official_size = OFFICIAL_EVAL_SAMPLES.get(benchmark)
    spec = DerivedRulesSpec(benchmark, ruleset, float(OFFICIAL_TARGET[benchmark]),
                            int(official_size) if official_size else None)
    rules = write_derived_rules(spec, tmp_path / "rules")
    verdicts = {}
    for name, run in _variants(benchmark).items():
        log = run.write(tmp_path / f"{name}.log")
        official, derived = check_log(log, ruleset), check_log(log, ruleset, rules)
        assert derived.failed_keys == official.failed_keys, name
        verdicts[name] = official.passed
    # The variants really exercise the rules: the good log passes, a miss of the target fails.
    assert verdicts["good"] and not verdicts["below_target"]


@pytest.mark.parametrize("benchmark,ruleset", ALL)
def test_derived_rules_change_only_target_and_eval_size(benchmark, ruleset):
    size = 4242 if benchmark in OFFICIAL_EVAL_SAMPLES else None
    text = derive_rules_text(DerivedRulesSpec(benchmark, ruleset, 0.7125, size))
    assert text.startswith("# UNOFFICIAL compliance rules -- NOT the MLPerf rules.")
    records = yaml.load(text, Loader=yaml.BaseLoader)  # how the checker reads it
    keys = {r["KEY"]["NAME"]: r["KEY"] for r in records if "KEY" in r}
    assert keys["eval_accuracy"]["ATLEAST_ONE_CHECK"].startswith("v['value'] >= 0.7125 and")
    assert not any("enqueue_config" in k.get("POST", "") for k in keys.values())
    if size:
        assert keys["eval_samples"]["CHECK"] == " v['value'] == 4242 "


def test_eval_size_is_required_exactly_for_dcnv2():
    with pytest.raises(ValueError, match="eval_samples"):
        derive_rules_text(DerivedRulesSpec("dlrm_dcnv2", "6.0.0", 0.75))
    with pytest.raises(ValueError, match="eval_samples"):
        derive_rules_text(DerivedRulesSpec("dlrm", "2.1.0", 0.75, 1000))
    with pytest.raises(ValueError, match="6.1.0"):
        derive_rules_text(DerivedRulesSpec("dlrm_dcnv2", "6.1.0", 0.75, 1000))


@pytest.mark.parametrize("spec", COMMITTED_SPECS, ids=lambda s: f"{s.benchmark}-{s.ruleset}")
def test_committed_rule_files_are_exactly_what_derive_generates(spec):
    assert committed_rules_path(spec).read_text() == derive_rules_text(spec)
