"""The memory check's optimizer state is what fbgemm's fused kernel allocates: for each
`optim.name`, the kernel optim/fused.fused_params picks, built on CPU as the
sharded tables' fused optimizer is, holds exactly `table_optimizer_state`'s values."""

from __future__ import annotations

import pytest
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen)

from dlrmtrain.config import load_config
from dlrmtrain.optim.fused import fused_params
from dlrmtrain.optim.state_size import table_optimizer_state


@pytest.mark.parametrize("name, per_row, per_element", [("sgd", 0, 0), ("adagrad", 0, 1),
                                                       ("adam", 1, 0)])
def test_the_state_counted_is_the_state_fbgemm_keeps(name, per_row, per_element):
    optim = load_config(None, [f"optim.name={name}"]).optim
    state = table_optimizer_state(optim)
    assert (state.per_row, state.per_element) == (per_row, per_element)
    tables = {"a": (10, 4), "b": (7, 16)}
    kernel = SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU) for rows, dim in tables.values()],
        optimizer=fused_params(optim, "fp32", "cpu")["optimizer"], learning_rate=0.1)
    kept = kernel.split_optimizer_states()
    held = [sum(t.numel() for t in table) for table in kept] if kept else [0, 0]
    assert held == [state.values(rows, dim) for rows, dim in tables.values()]


def test_the_state_is_described_as_the_kernel_keeps_it():
    describe = {name: table_optimizer_state(load_config(None, [f"optim.name={name}"]).optim).describe()
                for name in ("sgd", "adagrad", "adam")}
    assert describe == {"sgd": "optim.name sgd: fbgemm's exact_sgd, none",
                        "adagrad": "optim.name adagrad: fbgemm's exact_adagrad, one fp32 per weight",
                        "adam": "optim.name adam: fbgemm's exact_row_wise_adagrad, one fp32 per row"}


def test_the_dense_state_is_read_off_the_dense_optimizer():
    """sgd keeps nothing, adagrad its sum, adam its two moments, per dense parameter value."""
    from dlrmtrain.optim.state_size import dense_optimizer_state

    assert {name: dense_optimizer_state(load_config(None, [f"optim.name={name}"]).optim).per_parameter
            for name in ("sgd", "adagrad", "adam")} == {"sgd": 0, "adagrad": 1, "adam": 2}
