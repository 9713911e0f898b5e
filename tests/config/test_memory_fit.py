"""The memory check (issue 34, item 10) counts the tables' optimizer state beside their
weights and runs for every family, through its Workload: a config whose tables fit by
their weights but not with the state is refused before anything is allocated, the
message naming both sizes; the same tables with a stateless optimizer start."""

from __future__ import annotations

import pytest
import torch

from dlrmtrain.config import load_config
from dlrmtrain.features import TABLE_NAMES
from dlrmtrain.run.errors import SetupError
from dlrmtrain.run.machine import available_bytes
from dlrmtrain.workloads import workload_of

CPU = torch.device("cpu")
GB = r"[\d,]+\.\d GB"


def _rows_filling(fraction: float, dim: int, names: list[str]) -> dict[str, int]:
    """Tables whose fp32 weights take `fraction` of this rank's available memory, the
    first table holding nearly all of it."""
    rows = int(fraction * available_bytes(CPU) / (4 * dim))
    return {name: rows if i == 0 else 10 for i, name in enumerate(names)}


def test_dlrm_tables_that_fit_by_weights_but_not_with_adagrads_state_are_refused():
    cfg = load_config(None, ["optim.name=adagrad", "model.embedding_dim=8",
                             "model.bottom_mlp=[16,8]", "model.top_mlp=[16,8,1]"])
    workload = workload_of(cfg)
    rows = _rows_filling(0.7, 8, TABLE_NAMES)
    with pytest.raises(SetupError, match=(
            rf"^the embedding tables need at least {GB} per rank for their fp32 weights and "
            rf"{GB} for their optimizer state \(optim\.name adagrad: fbgemm's exact_adagrad, one "
            rf"fp32 per weight\), {GB} in all \({GB} over 1 rank\(s\); the largest, t_cat_0, has "
            rf"[\d,]+ rows × 8 = {GB}\), but cpu memory has {GB} available per rank: lower "
            rf"data\.table_sizes .*optim\.name sgd keeps no table state")):
        workload.check_memory(cfg, rows, 1, CPU)
    sgd = load_config(None, ["optim.name=sgd", "model.embedding_dim=8"])
    workload_of(sgd).check_memory(sgd, rows, 1, CPU)  # the weights alone fit
    workload.check_memory(cfg, rows, 2, CPU)  # spread over two ranks, weights and state fit


def test_dlrmv4_tables_are_checked_too_with_their_row_wise_state():
    cfg = load_config(None, ["model.arch=dlrmv4_hstu", "data.source=synthetic_yambda",
                             "optim.name=adam", "model.embedding_dim=1"])
    workload = workload_of(cfg)
    rows = _rows_filling(0.7, 1, workload.table_names(cfg))
    with pytest.raises(SetupError, match=(
            rf"^the embedding tables need at least {GB} per rank for their fp32 weights and "
            rf"{GB} for their optimizer state \(optim\.name adam: fbgemm's exact_row_wise_adagrad, "
            rf"one fp32 per row\), {GB} in all .*the largest, item_id, .*: shrink the data's tables "
            rf"\(data\.yambda\.cross_rows")):
        workload.check_memory(cfg, rows, 1, CPU)
    too_big = _rows_filling(1.5, 1, workload.table_names(cfg))
    sgd = load_config(None, ["model.arch=dlrmv4_hstu", "data.source=synthetic_yambda",
                             "optim.name=sgd", "model.embedding_dim=1"])
    with pytest.raises(SetupError, match=rf"^the embedding tables need at least {GB} per rank "
                                         rf"for their fp32 weights \({GB} over 1 rank"):
        workload_of(sgd).check_memory(sgd, too_big, 1, CPU)
