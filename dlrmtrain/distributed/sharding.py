"""Sharders and DistributedModelParallel: the one place the model gets sharded.

DLRM's EmbeddingBagCollection (`shard_model`) and DLRMv4's sequence
EmbeddingCollection (`shard_sequence_model`) go through the same planner, and both
take the config sections they need (sharding), the run's placement (comm/placement.py:
where its codec runs, which hands back the sharder, what to install after sharding and
the run's counters) and the fused parameters.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from torchrec.distributed.model_parallel import DefaultDataParallelWrapper, DistributedModelParallel
from torchrec.distributed.types import ModuleSharder

from dlrmtrain.comm.placement import Placement
from dlrmtrain.comm.stats import CommCounters
from dlrmtrain.comm.torchrec.kernels import emit_rows_in
from dlrmtrain.config.schema import CommConfig, ShardingConfig
from dlrmtrain.distributed.planner import EBC_PATH, build_sharding_plan, describe_plan


class ShardedModel(NamedTuple):
    """What sharding hands back: the model, its plan and the run's all-to-all counters."""

    model: DistributedModelParallel
    plan: str
    """the sharding plan, printable"""
    counters: CommCounters
    """every counter of the model's all-to-alls (codec dists, stock dists, lookups), one registry"""


def build_ebc_sharder(comm: CommConfig, fused_params: dict[str, Any], device_type: str = "cpu") -> ModuleSharder:
    """The EmbeddingBagCollection sharder the run's placement gives (comm/placement.py): TorchRec's
    own when every table's codec is `none`, the codec sharder that swaps the output dists, or the
    sample side's; the device type picks TorchRec's quantized-comms kernels for the lossy codecs."""
    return Placement(comm, "pooled").sharder(fused_params, device_type)


def shard_model(model: torch.nn.Module, sharding: ShardingConfig, placement: Placement, fused_params: dict[str, Any],
                device: torch.device, world_size: int, ddp_bucket_mb: float | None = None,
                ebc_path: str = EBC_PATH) -> ShardedModel:
    """Wrap the single-device model, whose EmbeddingBagCollection is at `ebc_path` (DLRM's by
    default; "" for a bare EBC), in DMP with the configured plan and the sharder `placement`
    gives (a pooled one); returns the sharded model, a printable description of the plan and
    the run's counters."""
    sharder = placement.sharder(fused_params, device.type)
    plan = build_sharding_plan(model, sharding, world_size, device.type, sharder, module_path=ebc_path)
    dmp = _dmp(model, plan, sharder, device, ddp_bucket_mb)
    return ShardedModel(dmp, describe_plan(plan), placement.after_sharding(dmp))


def _dmp(model: torch.nn.Module, plan, sharder: ModuleSharder, device: torch.device,
         ddp_bucket_mb: float | None) -> DistributedModelParallel:
    wrapper = DefaultDataParallelWrapper(bucket_cap_mb=ddp_bucket_mb) if ddp_bucket_mb else None
    dmp = DistributedModelParallel(module=model, device=device, plan=plan, sharders=[sharder],
                                   data_parallel_wrapper=wrapper)
    # the fused params' row dtype from every lookup: bf16 on CPU as on GPU (precision.py)
    emit_rows_in(dmp, (sharder.fused_params or {}).get("output_dtype", SparseType.FP32))
    return dmp


# ------------------------------------------------ DLRMv4: the sequence EmbeddingCollection
def rowwise_adagrad_fused_params(lr: float, eps: float, output_dtype=None) -> dict[str, Any]:
    """The fused kernel's parameters for DLRMv4's tables: RowWiseAdagrad (one accumulator per row)
    inside the embedding backward, as the MLPerf reference's sparse optimizer."""
    params: dict[str, Any] = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": lr, "eps": eps}
    if output_dtype is not None:
        params["output_dtype"] = output_dtype
    return params


def build_ec_sharder(comm: CommConfig, fused_params: dict[str, Any], device_type: str = "cpu") -> ModuleSharder:
    """The EmbeddingCollection sharder the run's placement gives: TorchRec's own when every table's
    codec is `none`, the codec sharder whose dists carry the sequence all-to-all, or the sample side's."""
    return Placement(comm, "sequence").sharder(fused_params, device_type)


def shard_sequence_model(model: torch.nn.Module, ec_path: str, sharding: ShardingConfig, placement: Placement,
                         fused_params: dict[str, Any], device: torch.device, world_size: int,
                         ddp_bucket_mb: float | None = None) -> ShardedModel:
    """`shard_model` for a model whose sequence tables are the EmbeddingCollection at `ec_path`
    (`placement` a sequence one).

    `sharding.default_type` row_wise is the reference's layout; table-/column-wise per
    table by config. Returns the sharded model, a printable plan and the run's counters.
    """
    sharder = placement.sharder(fused_params, device.type)
    plan = build_sharding_plan(model, sharding, world_size, device.type, sharder, module_path=ec_path)
    dmp = _dmp(model, plan, sharder, device, ddp_bucket_mb)
    return ShardedModel(dmp, describe_plan(plan), placement.after_sharding(dmp))
