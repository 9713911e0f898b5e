"""The memory check (issue 34, item 10) counts the optimizers' state beside the weights
and runs for every family, through its Workload: a model that fits by its weights but
not with the state is refused before anything is allocated, the message naming both
sizes; the same model with a stateless optimizer (sgd) starts."""

from __future__ import annotations

import pytest
import torch

from dlrmtrain.config import load_config
from dlrmtrain.features import TABLE_NAMES
from dlrmtrain.models.hstu.size import model_size
from dlrmtrain.models.hstu.tables import hstu_table_rows
from dlrmtrain.optim.state_size import dense_optimizer_state, table_optimizer_state
from dlrmtrain.run.errors import SetupError
from dlrmtrain.run.machine import available_bytes, check_model_fits
from dlrmtrain.workloads import workload_of

CPU = torch.device("cpu")
GB = r"[\d,]+\.\d [KMG]B"
V4 = ["model.arch=dlrmv4_hstu", "data.source=synthetic_yambda"]


def _rows_filling(fraction: float, dim: int, names: list[str]) -> dict[str, int]:
    """Tables whose fp32 weights take `fraction` of this rank's available memory, the
    first table holding nearly all of it."""
    rows = int(fraction * available_bytes(CPU) / (4 * dim))
    return {name: rows if i == 0 else 10 for i, name in enumerate(names)}


def test_dlrm_tables_that_fit_by_weights_but_not_with_adagrads_state_are_refused():
    small = ["model.embedding_dim=8", "model.bottom_mlp=[16,8]", "model.top_mlp=[16,8,1]"]
    cfg = load_config(None, ["optim.name=adagrad", *small])
    workload = workload_of(cfg)
    rows = _rows_filling(0.7, 8, TABLE_NAMES)
    with pytest.raises(SetupError, match=(
            rf"^the embedding tables need at least {GB} per rank for their fp32 weights and "
            rf"{GB} for their optimizer state \(optim\.name adagrad: fbgemm's exact_adagrad, one "
            rf"fp32 per weight\), and every rank holds the [\d,]+ dense parameters with their "
            rf"optimizer state \(optim\.name adagrad: 1 fp32 per parameter\), {GB}: {GB} in all "
            rf"\({GB} of tables over 1 rank\(s\); the largest, t_cat_0, has [\d,]+ rows × 8 = "
            rf"{GB}\), but cpu memory has {GB} available per rank: lower data\.table_sizes .*"
            rf"optim\.name sgd keeps no optimizer state\)$")):
        workload.check_memory(cfg, rows, 1, CPU)
    sgd = load_config(None, ["optim.name=sgd", *small])
    workload_of(sgd).check_memory(sgd, rows, 1, CPU)  # the weights alone fit
    workload.check_memory(cfg, rows, 2, CPU)  # spread over two ranks, weights and state fit


def test_dlrmv4_tables_are_checked_too_with_their_row_wise_state():
    cfg = load_config(None, [*V4, "optim.name=adam", "model.embedding_dim=1"])
    workload = workload_of(cfg)
    rows = _rows_filling(0.7, 1, workload.table_names(cfg))
    with pytest.raises(SetupError, match=(
            rf"^the embedding tables need at least {GB} per rank for their fp32 weights and "
            rf"{GB} for their optimizer state \(optim\.name adam: fbgemm's exact_row_wise_adagrad, "
            rf"one fp32 per row\), and every rank holds the [\d,]+ dense parameters with their "
            rf"optimizer state \(optim\.name adam: 2 fp32 per parameter\).*the largest, item_id, "
            rf".*: shrink the data's tables \(data\.yambda\.cross_rows")):
        workload.check_memory(cfg, rows, 1, CPU)
    sgd = load_config(None, [*V4, "optim.name=sgd", "model.embedding_dim=1"])
    workload_of(sgd).check_memory(sgd, rows, 1, CPU)
    too_big = _rows_filling(1.5, 1, workload.table_names(cfg))
    with pytest.raises(SetupError, match=rf"^the embedding tables need at least {GB} per rank "
                                         rf"for their fp32 weights, and every rank holds the "):
        workload_of(sgd).check_memory(sgd, too_big, 1, CPU)


def test_the_dense_parameters_every_rank_holds_count_with_adams_two_moments():
    """Tables that fit over the ranks, beside dense parameters that fit alone but not with
    Adam's two moments per parameter (every rank holds them all)."""
    free = available_bytes(CPU)
    rows = {"t": int(0.3 * free / 4)}
    dense = int(0.3 * free / 4)
    sgd, adam = (load_config(None, [f"optim.name={name}"]).optim for name in ("sgd", "adam"))
    check_model_fits(rows, {"t": 1}, table_optimizer_state(sgd), dense, dense_optimizer_state(sgd),
                     1, CPU, "smaller")
    with pytest.raises(SetupError, match=rf"every rank holds the [\d,]+ dense parameters with "
                                         rf"their optimizer state \(optim\.name adam: 2 fp32 per "
                                         rf"parameter\), {GB}: {GB} in all"):
        check_model_fits(rows, {"t": 1}, table_optimizer_state(sgd), dense,
                         dense_optimizer_state(adam), 1, CPU, "smaller")


@pytest.mark.parametrize("config, overrides", [("configs/mlperf_dlrmv4.yaml", []),
                                               ("configs/mini_dlrmv4.yaml", [])])
def test_the_dense_count_is_the_hstu_size_formulas(config, overrides):
    """DLRMv4's dense parameters, counted on its model built on meta, are models/hstu/size.py's."""
    from tests.config.test_workloads import PACKAGE

    cfg = load_config(PACKAGE.parent / config, overrides)
    rows = hstu_table_rows(cfg.model.max_table_rows)
    assert workload_of(cfg).dense_parameters(cfg, rows) == model_size(cfg).total_dense
