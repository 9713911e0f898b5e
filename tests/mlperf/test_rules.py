"""Derived rules are the official rules with only the target and eval size changed
(dlrmv4: and the numbers its rules tie to the full-size run, `Dlrmv4Scale`)."""

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
    Dlrmv4Scale,
    committed_rules_path,
)
from dlrmtrain.mlperf.rules.derive import derive_rules_text, write_derived_rules
from tests.mlperf.simulated_run import OFFICIAL_DLRMV4, SimulatedRun

ALL = [(b, r) for b, rulesets in RULESETS.items() for r in rulesets]
# closed_dlrmv4.yaml's own numbers, as a scale.
OFFICIAL_DLRMV4_SCALE = Dlrmv4Scale(
    train_samples=2290835423, max_sequence_length=4096, warmup_steps=24000, reference_lr=1e-6,
    eval_every_data_pct=0.001, skip_eval_epoch_pct=None)


def _variants(benchmark):
    """Logs that meet the official numbers, each broken in one way (or not at all)."""
    size = int(OFFICIAL_EVAL_SAMPLES.get(benchmark, 1024))
    if benchmark == "dlrmv4":
        return _dlrmv4_variants(size)
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


def _dlrmv4_variants(size):
    full = dict(dlrmv4=OFFICIAL_DLRMV4, eval_samples=size)
    good = dict(aucs=(0.74, 0.7512), **full)
    return {
        "good": SimulatedRun("dlrmv4", **good),
        "below_target": SimulatedRun("dlrmv4", aucs=(0.74, 0.7499), **full),
        "wrong_hyperparameter": SimulatedRun("dlrmv4", config_changes={"optim.adam_eps": 1e-6},
                                             **good),
        "lr_out_of_band": SimulatedRun("dlrmv4", config_changes={"optim.lr": 1.6e-6}, **good),
        "off_the_grid": SimulatedRun("dlrmv4", eval_shift_steps=1, **good),
        "first_eval_early": SimulatedRun("dlrmv4", eval_shift_steps=-280, **good),  # block 24
        "other_eval_size": SimulatedRun("dlrmv4", aucs=good["aucs"], dlrmv4=OFFICIAL_DLRMV4,
                                        eval_samples=size - 1),
    }


def _official_numbers_spec(benchmark, ruleset):
    official_size = OFFICIAL_EVAL_SAMPLES.get(benchmark)
    return DerivedRulesSpec(benchmark, ruleset, float(OFFICIAL_TARGET[benchmark]),
                            int(official_size) if official_size else None,
                            OFFICIAL_DLRMV4_SCALE if benchmark == "dlrmv4" else None)


@pytest.mark.parametrize("benchmark,ruleset", ALL)
def test_derived_with_official_numbers_judges_like_the_official_rules(tmp_path, benchmark, ruleset):
    spec = _official_numbers_spec(benchmark, ruleset)
    rules = write_derived_rules(spec, tmp_path / "rules")
    verdicts = {}
    for name, run in _variants(benchmark).items():
        log = run.write(tmp_path / f"{name}.log")
        official, derived = check_log(log, ruleset), check_log(log, ruleset, rules)
        assert derived.failed_keys == official.failed_keys, name
        verdicts[name] = official.passed
    # The variants really exercise the rules: the good log passes, a miss of the target fails
    # (dlrmv4: every broken variant fails; the older rules do not check all of them).
    assert verdicts["good"] and not verdicts["below_target"]
    if benchmark == "dlrmv4":
        assert not any(v for name, v in verdicts.items() if name != "good"), verdicts


@pytest.mark.parametrize("benchmark,ruleset", [(b, r) for b, r in ALL if b != "dlrmv4"])
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


def test_dlrmv4_derived_rules_differ_from_official_only_in_the_scaled_numbers():
    official = derive_rules_text(_official_numbers_spec("dlrmv4", "6.1.0"))
    small = derive_rules_text(DerivedRulesSpec("dlrmv4", "6.1.0", 0.7125, 4242, Dlrmv4Scale(
        train_samples=65536, max_sequence_length=64, warmup_steps=50, reference_lr=0.032,
        eval_every_data_pct=0.05, skip_eval_epoch_pct=0.2)))
    assert small.startswith("# UNOFFICIAL compliance rules -- NOT the MLPerf rules.")
    body = [line for line in official.splitlines() if not line.startswith("#")]
    changed = [(a.strip(), b.strip()) for a, b in zip(
        body, [line for line in small.splitlines() if not line.startswith("#")]) if a != b]
    assert changed == [
        ("'train_samples': 2290835423,", "'train_samples': 65536,"),
        ("'target_accuracy': 0.75,", "'target_accuracy': 0.7125,"),
        ("CHECK: ' v[''value''] == 2058204 '", "CHECK: ' v[''value''] == 4242 '"),
        ("1, int(math.ceil(0.001 * s['train_samples'] / v['value']))",
         "1, int(math.ceil(0.05 * s['train_samples'] / v['value']))"),
        ("math.floor((4480 * v['value'] + 135331840) / 3)",
         "max(1, math.ceil(0.2 * s['train_samples'] / v['value'])) * v['value']"),
        ("s['lr_min'] = 5e-07 * v['value'] / 8192", "s['lr_min'] = 0.016 * v['value'] / 8192"),
        ("s['lr_max'] = 1.5e-06 * v['value'] / 8192", "s['lr_max'] = 0.048 * v['value'] / 8192"),
        ("CHECK: ' v[''value''] == 4096 '", "CHECK: ' v[''value''] == 64 '"),
        ("CHECK: ' v[''value''] == 24000 '", "CHECK: ' v[''value''] == 50 '"),
        ("CHECK: ' v[''value''] == 0.001 '", "CHECK: ' v[''value''] == 0.05 '"),
    ]


def test_eval_size_is_required_exactly_for_dcnv2():
    with pytest.raises(ValueError, match="eval_samples"):
        derive_rules_text(DerivedRulesSpec("dlrm_dcnv2", "6.0.0", 0.75))
    with pytest.raises(ValueError, match="eval_samples"):
        derive_rules_text(DerivedRulesSpec("dlrm", "2.1.0", 0.75, 1000))
    with pytest.raises(ValueError, match="6.1.0"):
        derive_rules_text(DerivedRulesSpec("dlrm_dcnv2", "6.1.0", 0.75, 1000))
    with pytest.raises(ValueError, match="Dlrmv4Scale"):
        derive_rules_text(DerivedRulesSpec("dlrmv4", "6.1.0", 0.75, 1000))
    with pytest.raises(ValueError, match="Dlrmv4Scale"):
        derive_rules_text(DerivedRulesSpec("dlrm_dcnv2", "6.0.0", 0.75, 1000, OFFICIAL_DLRMV4_SCALE))


@pytest.mark.parametrize("spec", COMMITTED_SPECS, ids=lambda s: f"{s.benchmark}-{s.ruleset}")
def test_committed_rule_files_are_exactly_what_derive_generates(spec):
    assert committed_rules_path(spec).read_text() == derive_rules_text(spec)
