"""The fused (in-backward) table optimizer: which fbgemm kernel an `optim` section gets,
and what the lookup emits.

Sharded tables are updated by fbgemm inside the embedding backward pass; the sharders
(distributed/sharding.py) hand these parameters to it, and the memory check reads the
kernel's state from the same choice (state_size.py), so `optim.name` is mapped once.
"""

from __future__ import annotations

from typing import Any

from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dlrmtrain.config.schema import OptimConfig
from dlrmtrain.precision import embedding_output_dtype


def fused_params(optim: OptimConfig, precision: str, device_type: str) -> dict[str, Any]:
    """Parameters of the fused lookup kernel: the optimizer fbgemm runs inside the
    embedding backward, and the dtype the lookup emits."""
    params: dict[str, Any] = {"learning_rate": optim.lr,
                              "output_dtype": embedding_output_dtype(precision, device_type)}
    if optim.name == "sgd":
        return {**params, "optimizer": EmbOptimType.EXACT_SGD}
    if optim.name == "adam":  # DLRMv4: dense Adam, tables RowWiseAdagrad (the reference's pairing)
        return {**params, "optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "eps": optim.adagrad_eps}
    return {**params, "optimizer": EmbOptimType.EXACT_ADAGRAD, "eps": optim.adagrad_eps}
