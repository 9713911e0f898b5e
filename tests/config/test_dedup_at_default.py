"""comm.dedup_at left unset resolves once (validation.resolve_config): to `source` where the run's
codec dedups and its path carries it, else `owner`, with the one line the run prints saying why;
an explicit value is kept, and an explicit `source` a path cannot take stays refused (issue 33)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrmtrain.config.loader import ConfigError, load_config
from dlrmtrain.validation import placement_note, resolve_config, unresolved_keys, validate_config

MINI_V4 = str(Path(__file__).resolve().parents[2] / "configs" / "mini_dlrmv4.yaml")

OWNER_FOR_A_REASON = {  # name: (config, overrides, what the printed line names)
    "adagrad": (None, ["comm.codec=dedup", "optim.name=adagrad"], "optim.name: adagrad"),
    "lossy fp16": (None, ["comm.codec=dedup+fp16"], "comm.codec: dedup+fp16"),
    "lossy bf16": (None, ["comm.codec=dedup+bf16"], "comm.codec: dedup+bf16"),
    "two levels": (None, ["comm.codec=dedup", "comm.hierarchy=node", "comm.ranks_per_node=1"],
                   "comm.hierarchy: node"),
    "per-table lossy": (None, ["comm.codec=dedup", "comm.table_codecs={t_cat_1: dedup+fp16}"],
                        "comm.table_codecs.t_cat_1"),
    "per-table dedup under none": (None, ["comm.codec=none", "comm.table_codecs={t_cat_1: dedup}"],
                                   "comm.codec: none"),
    "sequence per-table dedup under auto": (MINI_V4, ["comm.codec=auto", "comm.table_codecs={uid: dedup}"],
                                            "comm.table_codecs.uid"),
}
SOURCE = {
    "dedup": (None, ["comm.codec=dedup"]),
    "auto": (None, ["comm.codec=auto"]),
    "pipelined": (None, ["comm.codec=dedup", "run.pipeline=sparse_dist"]),
    "per-table none": (None, ["comm.codec=dedup", "comm.table_codecs={t_cat_1: none}"]),
    "a few row-wise tables": (None, ["comm.codec=dedup", "sharding.tables={t_cat_1: row_wise, t_cat_2: row_wise}"]),
    "sequence dedup": (MINI_V4, ["comm.codec=dedup"]),
    "sequence auto": (MINI_V4, ["comm.codec=auto"]),
}


def _resolved(path, overrides):
    loaded = load_config(path, overrides)
    return loaded, resolve_config(loaded)


@pytest.mark.parametrize("name", list(OWNER_FOR_A_REASON))
def test_unset_resolves_to_owner_and_says_why(name):
    path, overrides, why = OWNER_FOR_A_REASON[name]
    loaded, cfg = _resolved(path, overrides)
    assert loaded.comm.dedup_at is None and "comm.dedup_at" in unresolved_keys(loaded)
    assert cfg.comm.dedup_at == "owner" and unresolved_keys(cfg) == []
    note = placement_note(loaded, cfg)
    assert note.startswith("comm.dedup_at: owner (") and why in note, note
    # the same run asked explicitly for source is refused, naming the key
    with pytest.raises(ConfigError, match="comm.dedup_at: source|comm.table_codecs"):
        validate_config(load_config(path, [*overrides, "comm.dedup_at=source"]), 2)


@pytest.mark.parametrize("name", list(SOURCE))
def test_unset_resolves_to_source_where_the_path_carries_it(name):
    loaded, cfg = _resolved(*SOURCE[name])
    assert cfg.comm.dedup_at == "source" and placement_note(loaded, cfg) is None
    validate_config(cfg, 2)


def test_mostly_row_wise_tables_resolve_to_owner_yet_take_an_explicit_source():
    """A choice, not a refusal: at the source a row-wise table's output sends world size x its
    distinct rows (TorchRec's reduce-scatter), owner-side dedup the distinct rows once."""
    overrides = ["comm.codec=dedup", "sharding.default_type=row_wise", "sharding.tables={t_cat_1: table_wise}"]
    loaded, cfg = _resolved(None, overrides)
    assert cfg.comm.dedup_at == "owner"
    assert placement_note(loaded, cfg) == ("comm.dedup_at: owner (sharding: 25 of 26 tables row-wise: at the "
                                          "source their output sends world size x the distinct rows)")
    validate_config(load_config(None, [*overrides, "comm.dedup_at=source"]), 2)
    # data-parallel tables never cross: a half that is row-wise among those that do is no majority
    _, cfg = _resolved(None, ["comm.codec=dedup", "sharding.default_type=data_parallel",
                              "sharding.tables={t_cat_1: row_wise, t_cat_2: table_wise}"])
    assert cfg.comm.dedup_at == "source"


def test_unset_without_a_deduping_codec_is_owner_and_prints_nothing():
    loaded, cfg = _resolved(None, ["comm.codec=fp16"])
    assert cfg.comm.dedup_at == "owner" and placement_note(loaded, cfg) is None


@pytest.mark.parametrize("value", ["owner", "source"])
def test_an_explicit_value_is_kept_and_prints_nothing(value):
    loaded, cfg = _resolved(None, ["comm.codec=dedup", f"comm.dedup_at={value}"])
    assert cfg.comm.dedup_at == value and placement_note(loaded, cfg) is None
    validate_config(cfg, 2)


def test_an_explicit_owner_stays_where_source_would_be_taken():
    # e.g. a run made before the default: its config.yaml says owner, and its resume keeps it
    _, cfg = _resolved(None, ["comm.codec=dedup", "comm.dedup_at=owner", "sharding.default_type=column_wise"])
    assert cfg.comm.dedup_at == "owner"


def test_an_explicit_source_the_path_cannot_take_stays_refused():
    with pytest.raises(ConfigError, match="comm.dedup_at: source.*EXACT_ADAGRAD"):
        validate_config(load_config(None, ["comm.codec=dedup", "optim.name=adagrad", "comm.dedup_at=source"]), 2)


@pytest.mark.parametrize("builder", ["build_ebc_sharder", "build_ec_sharder"])
def test_a_sharder_asked_with_the_key_unset_refuses_by_name(builder):
    """Both sharders need to know where dedup happens; an unset key reached the sequence one as
    `None` (a ValueError naming nothing useful) and the pooled one silently as `owner`."""
    from dlrmtrain.config.schema import CommConfig
    from dlrmtrain.distributed import sharding

    with pytest.raises(ValueError, match=r"comm\.dedup_at is unset: resolve the config first"):
        getattr(sharding, builder)(CommConfig(codec="dedup"), sharding.rowwise_adagrad_fused_params(0.01, 1e-8))
