"""bench_train.py's plain TorchRec contender builds the config's architecture or refuses:
on the DCNv2 config it once built DLRM v1, a cheaper model, and reported dlrmtrain 4x slower."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from dlrmtrain.config import load_config
from dlrmtrain.data.datasets import table_rows
from dlrmtrain.workloads.dlrm import build_dlrm_model as build_model
from tests.scripts import load_script

REPO = Path(__file__).resolve().parents[2]


def bench_train():
    return load_script("bench_train")


def dense_shapes(model) -> dict[str, tuple[int, ...]]:
    """Every non-embedding parameter's shape, named from the DLRM module down."""
    return {name.removeprefix("model."): tuple(p.shape) for name, p in model.named_parameters()
            if "embedding_bag_collection" not in name}


@pytest.mark.parametrize("shape", ["quickstart", "dcnv2"])
def test_plain_contender_is_the_configs_architecture(shape):
    script = bench_train()
    config, overrides = script.SHAPES[shape]
    cfg = load_config(REPO / config, overrides + ["model.max_table_rows=100"])
    plain = script.plain_torchrec_model(cfg, table_rows(cfg), torch.device("cpu"))
    ours = build_model(cfg, table_rows(cfg), torch.device("cpu"))
    # ours is torchrec's class with a sparse-first forward (models/dlrm.py); plain keeps torchrec's
    assert type(plain.model) in type(ours.model).__bases__, (type(ours.model), type(plain.model))
    assert dense_shapes(plain) == dense_shapes(ours)


def test_plain_contender_refuses_an_architecture_it_cannot_build():
    script = bench_train()
    cfg = load_config(REPO / "configs/quickstart.yaml")
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, arch="dlrm_v3"))
    with pytest.raises(SystemExit, match="no plain TorchRec model for model.arch='dlrm_v3'"):
        script.plain_torchrec_model(cfg, table_rows(cfg), torch.device("cpu"))


def test_a_contender_given_twice_is_refused_not_merged(capsys):
    """Contenders are keyed by their overrides: the same --vs twice was silently one contender."""
    with pytest.raises(SystemExit) as e:
        bench_train().parse_args(["--vs", "comm.codec=dedup", "--vs", "comm.codec=dedup "])
    assert e.value.code == 2 and "given twice" in capsys.readouterr().err
    assert bench_train().parse_args(["--vs", "comm.codec=dedup", "--vs", "comm.codec=auto"]).vs == [
        "comm.codec=dedup", "comm.codec=auto"]


def test_wire_worth_prices_only_the_bytes_a_contender_saves(monkeypatch, capsys):
    """Behind one shaped link every byte pays the rate: 125 kB less per step at 1 Gbit/s is
    1 ms off a 10 ms step; without the link's rate (unshaped, simulated nodes) nothing is priced."""
    script = bench_train()
    median = {"none": 0.010, "dedup": 0.009, "lossy": 0.008}
    sent = {"none": [250_000.0], "dedup": [125_000.0], "lossy": [250_000.0]}
    monkeypatch.delenv(script.LINK_GBIT_ENV, raising=False)
    assert script.print_wire_worth(list(median), median, sent) == {}
    monkeypatch.setenv(script.LINK_GBIT_ENV, "1")
    worth = script.print_wire_worth(list(median), median, sent)
    assert worth == pytest.approx({"dedup": 0.9, "lossy": 1.0})
    assert "0.900 of (none)'s time" in capsys.readouterr().out
