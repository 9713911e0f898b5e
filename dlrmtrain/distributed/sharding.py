"""Sharders and DistributedModelParallel: the one place the model gets sharded.

DLRM's EmbeddingBagCollection (`shard_model`) and DLRMv4's sequence
EmbeddingCollection (`shard_sequence_model`) go through the same planner, and both
take the config sections they need (sharding, comm) and the fused parameters.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.distributed.model_parallel import DefaultDataParallelWrapper, DistributedModelParallel
from torchrec.distributed.types import ModuleSharder

from dlrmtrain.comm.dedup.source import SourceDedupEBCSharder, row_wise_dists_for_source
from dlrmtrain.comm.embedding import make_ec_sharder
from dlrmtrain.comm.stock_bytes import count_sequence_stock_dists
from dlrmtrain.comm.embeddingbag import make_ebc_sharder
from dlrmtrain.comm.lookups import count_lookups
from dlrmtrain.comm.stats import CommCounters
from dlrmtrain.comm.stock_bytes import count_stock_dists
from dlrmtrain.comm.topology import Hierarchy
from dlrmtrain.comm.torchrec.kernels import round_cpu_lookups
from dlrmtrain.config.schema import CommConfig, ShardingConfig
from dlrmtrain.distributed.planner import EBC_PATH, build_sharding_plan, describe_plan


class ShardedModel(NamedTuple):
    """What sharding hands back: the model, its plan and the run's all-to-all counters."""

    model: DistributedModelParallel
    plan: str
    """the sharding plan, printable"""
    counters: CommCounters
    """every counter of the model's all-to-alls (codec dists, stock dists, lookups), one registry"""


def check_dedup_at_resolved(comm: CommConfig) -> None:
    """Refuse a `comm.dedup_at` still unset: both sharders need to know where dedup happens,
    and an unset key means "what this run's path carries", which only the resolved config knows."""
    if comm.dedup_at is None:
        raise ValueError("comm.dedup_at is unset: resolve the config first (validation.resolve_config), "
                         "or give comm.dedup_at: owner or source")


def build_ebc_sharder(comm: CommConfig, fused_params: dict[str, Any], device_type: str = "cpu",
                      counters: CommCounters | None = None) -> ModuleSharder:
    """The EmbeddingBagCollection sharder: TorchRec's own when every table's codec is
    `none`, else the codec sharder that swaps the output dists (dlrmtrain/comm); the
    device type picks TorchRec's quantized-comms kernels for the lossy codecs. Under
    comm.dedup_at: source the batch comes deduplicated and TorchRec's own dists carry it."""
    check_dedup_at_resolved(comm)
    if comm.dedup_at == "source":
        return SourceDedupEBCSharder(fused_params=fused_params)
    return make_ebc_sharder(comm.codec, dict(comm.table_codecs), fused_params, device_type, Hierarchy.of(comm),
                            comm.auto, counters)


def shard_model(model: torch.nn.Module, sharding: ShardingConfig, comm: CommConfig, fused_params: dict[str, Any],
                device: torch.device, world_size: int, ddp_bucket_mb: float | None = None,
                ebc_path: str = EBC_PATH) -> ShardedModel:
    """Wrap the single-device model, whose EmbeddingBagCollection is at `ebc_path` (DLRM's by
    default; "" for a bare EBC), in DMP with the configured plan; returns the sharded model, a
    printable description of the plan and the run's counters."""
    counters = CommCounters()
    sharder = build_ebc_sharder(comm, fused_params, device.type, counters)
    plan = build_sharding_plan(model, sharding, world_size, device.type, sharder, module_path=ebc_path)
    dmp = _dmp(model, plan, sharder, device, ddp_bucket_mb)
    if comm.dedup_at == "source":  # row-wise tables take the distinct bags over Gloo too
        row_wise_dists_for_source(dmp)
    # bytes of the all-to-alls left to TorchRec's stock dist (codec none; dedup at the source)
    count_stock_dists(dmp, counters, comm.codec if comm.dedup_at == "source" else "none")  # dedup, or auto's two forms
    count_lookups(dmp, counters)  # ids and rows each lookup takes, every codec alike
    return ShardedModel(dmp, describe_plan(plan), counters)


def _dmp(model: torch.nn.Module, plan, sharder: ModuleSharder, device: torch.device,
         ddp_bucket_mb: float | None) -> DistributedModelParallel:
    wrapper = DefaultDataParallelWrapper(bucket_cap_mb=ddp_bucket_mb) if ddp_bucket_mb else None
    dmp = DistributedModelParallel(module=model, device=device, plan=plan, sharders=[sharder],
                                   data_parallel_wrapper=wrapper)
    round_cpu_lookups(dmp)  # bf16 rows on CPU as on GPU (precision.py)
    return dmp


# ------------------------------------------------ DLRMv4: the sequence EmbeddingCollection
def rowwise_adagrad_fused_params(lr: float, eps: float, output_dtype=None) -> dict[str, Any]:
    """The fused kernel's parameters for DLRMv4's tables: RowWiseAdagrad (one accumulator per row)
    inside the embedding backward, as the MLPerf reference's sparse optimizer."""
    params: dict[str, Any] = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": lr, "eps": eps}
    if output_dtype is not None:
        params["output_dtype"] = output_dtype
    return params


def build_ec_sharder(comm: CommConfig, fused_params: dict[str, Any], device_type: str = "cpu",
                     counters: CommCounters | None = None) -> ModuleSharder:
    """The EmbeddingCollection sharder: TorchRec's own when every table's codec is `none`, else
    the codec sharder whose `dedup` dists carry the sequence all-to-all (comm/embedding.py)."""
    check_dedup_at_resolved(comm)
    return make_ec_sharder(comm.codec, dict(comm.table_codecs), fused_params, device_type, Hierarchy.of(comm),
                           comm.dedup_at, comm.auto, counters)


def shard_sequence_model(model: torch.nn.Module, ec_path: str, sharding: ShardingConfig, comm: CommConfig,
                         fused_params: dict[str, Any], device: torch.device, world_size: int,
                         ddp_bucket_mb: float | None = None) -> ShardedModel:
    """`shard_model` for a model whose sequence tables are the EmbeddingCollection at `ec_path`.

    `sharding.default_type` row_wise is the reference's layout; table-/column-wise per
    table by config. Returns the sharded model, a printable plan and the run's counters.
    """
    counters = CommCounters()
    sharder = build_ec_sharder(comm, fused_params, device.type, counters)
    plan = build_sharding_plan(model, sharding, world_size, device.type, sharder, module_path=ec_path)
    dmp = _dmp(model, plan, sharder, device, ddp_bucket_mb)
    # bytes of the sequence all-to-alls left to TorchRec (codec none; dedup or auto at the source)
    count_sequence_stock_dists(dmp, counters, comm.codec if comm.dedup_at == "source" else "none")
    return ShardedModel(dmp, describe_plan(plan), counters)
