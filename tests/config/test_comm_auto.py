"""`comm.auto`: the `auto` codec's policy settings from the YAML and the command line.

Defaults are AutoPolicy's (declared once, in the schema); a setting no `auto` codec of the run
would read is refused, as are values the policy cannot run, each naming its key. That a set value
reaches the policies a run builds: tests/comm/test_plan_ahead.py (pooled, the Trainer),
test_auto_settled.py (sequence) and test_auto_source.py (at the source).
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from dlrmtrain.config import ConfigError, load_config
from dlrmtrain.config.schema import AutoConfig, Config
from dlrmtrain.run.identity import math_config
from dlrmtrain.validation import resolve_config, validate_config


def test_the_defaults_are_the_policys_and_it_has_no_setting_the_config_lacks():
    from dlrmtrain.comm.auto.policy import AutoPolicy

    settings = [f.name for f in fields(AutoConfig)]
    assert [f.name for f in fields(AutoPolicy) if f.init] == settings
    assert all(getattr(AutoPolicy(), k) == getattr(Config().comm.auto, k) for k in settings)


def test_settings_load_from_overrides_and_yaml(tmp_path):
    cfg = load_config(None, ["comm.codec=auto", "comm.auto.probe_steps=4", "comm.auto.margin=0.05"])
    assert (cfg.comm.auto.probe_steps, cfg.comm.auto.margin, cfg.comm.auto.warmup_steps) == (4, 0.05, 1)
    validate_config(cfg, 2)
    path = tmp_path / "c.yaml"
    path.write_text("comm:\n  codec: auto\n  auto:\n    check_every: 20\n    min_dwell: 40\n")
    assert (load_config(path).comm.auto.check_every, load_config(path).comm.auto.min_dwell) == (20, 40)


def test_a_per_table_auto_reads_them_too():
    from dlrmtrain.comm.auto.policy import AutoPolicy

    cfg = load_config(None, ["comm.table_codecs={t_cat_3: auto}", "comm.auto.probe_steps=4"])
    validate_config(cfg, 2)
    resolved = resolve_config(cfg)
    assert (resolved.comm.codec, resolved.comm.table_codecs) == ("none", {"t_cat_3": "auto"})
    assert AutoPolicy.of(resolved.comm.auto).probe_steps == 4  # the policy the table's auto runs


@pytest.mark.parametrize("overrides, message", [
    (["comm.auto.probe_steps=4"], r"^comm\.auto\.probe_steps: set, but no codec of this run is auto "
                                  r"\(comm\.codec: none\); remove it, or use comm\.codec: auto$"),
    (["comm.codec=dedup", "comm.auto.table_keep_fraction=0.5"], r"^comm\.auto\.table_keep_fraction: set, but"),
    (["comm.codec=auto", "comm.auto.probe_steps=0"], r"^comm\.auto\.probe_steps: must be at least 1, got 0"),
    # the policy's first step is warmup whatever the setting: 0 would silently run as 1
    (["comm.codec=auto", "comm.auto.warmup_steps=0"], r"^comm\.auto\.warmup_steps: must be at least 1, got 0"),
    (["comm.codec=auto", "comm.auto.min_probe_steps=0"], r"^comm\.auto\.min_probe_steps: must be at least 1"),
    (["comm.codec=auto", "comm.auto.min_probe_steps=7"],
     r"^comm\.auto\.min_probe_steps: 7 exceeds comm\.auto\.probe_steps 6"),
    (["comm.codec=auto", "comm.auto.check_every=0"], r"^comm\.auto\.check_every: must be at least 1"),
    (["comm.codec=auto", "comm.auto.drift_samples=0"], r"^comm\.auto\.drift_samples: must be at least 1"),
    (["comm.codec=auto", "comm.auto.retime_steps=0"], r"^comm\.auto\.retime_steps: must be at least 1"),
    (["comm.codec=auto", "comm.auto.margin=1"], r"^comm\.auto\.margin: must be below 1 .*comm\.codec: none"),
    (["comm.codec=auto", "comm.auto.drift=0"], r"^comm\.auto\.drift: must be positive"),
    (["comm.codec=auto", "comm.auto.table_keep_fraction=0"], r"^comm\.auto\.table_keep_fraction: .* \(0, 1\]"),
    (["comm.codec=auto", "comm.auto.table_keep_fraction=1.5"], r"^comm\.auto\.table_keep_fraction: .* \(0, 1\]"),
])
def test_values_auto_cannot_honour_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(load_config(None, overrides), 2)


@pytest.mark.parametrize("override, message", [
    ("comm.auto.margin=-0.1", r"comm\.auto\.margin: must not be negative"),
    ("comm.auto.close_call_retimes=-1", r"comm\.auto\.close_call_retimes: must not be negative"),
    ("comm.auto.probe_step=3", r"unknown key comm\.auto\.probe_step \(known in comm\.auto: check_every"),
])
def test_the_loader_refuses_negatives_and_unknown_keys(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["comm.codec=auto", override])


def test_the_settings_leave_the_runs_math_fingerprint_alone():
    """`auto` is lossless whatever it picks; a checkpoint resumes under other settings, and one
    written before comm.auto existed still does."""
    default = load_config(None, ["comm.codec=auto"])
    tuned = load_config(None, ["comm.codec=auto", "comm.auto.probe_steps=2", "comm.auto.drift=0.5"])
    assert math_config(tuned, 2) == math_config(default, 2)
    assert not any(k.startswith("comm.auto") for k in math_config(tuned, 2))


MINI_V4 = str(Path(__file__).resolve().parents[2] / "configs" / "mini_dlrmv4.yaml")


@pytest.mark.parametrize("path, overrides, where", [
    (None, ["comm.dedup_at=source"], r"comm\.dedup_at: source .*; remove it, or use comm\.dedup_at: owner$"),
    (MINI_V4, ["comm.dedup_at=owner"], "sequence embeddings"),
    (MINI_V4, ["comm.dedup_at=source"], r"comm\.dedup_at: source"),
])
def test_a_table_keep_fraction_no_auto_dist_reads_is_refused(path, overrides, where):
    """Only the owner's pooled auto dists choose per table (comm/auto/dist.py `_decide`); auto at
    the source and the sequence dists never read table_keep_fraction: set there, it would be dropped."""
    base = [*overrides, "comm.codec=auto"]
    validate_config(load_config(path, base), 2)
    with pytest.raises(ConfigError, match=rf"^comm\.auto\.table_keep_fraction: set, but .*under {where}"):
        validate_config(load_config(path, [*base, "comm.auto.table_keep_fraction=0.5"]), 2)
    validate_config(load_config(path, [*base, "comm.auto.probe_steps=4"]), 2)  # the others are read


def test_the_owners_pooled_auto_takes_a_table_keep_fraction():
    from dlrmtrain.comm.auto.policy import AutoPolicy

    cfg = load_config(None, ["comm.codec=auto", "comm.dedup_at=owner", "comm.auto.table_keep_fraction=0.5"])
    validate_config(cfg, 2)
    resolved = resolve_config(cfg)
    assert resolved.comm.codec == "auto" and resolved.comm.table_codecs == {}
    assert AutoPolicy.of(resolved.comm.auto).table_keep_fraction == 0.5  # what each table's choice reads
