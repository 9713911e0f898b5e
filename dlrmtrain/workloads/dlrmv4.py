"""DLRMv4 (`dlrmv4_hstu`): Yambda sequences (`synthetic_yambda`, `yambda`) into a sequence
EmbeddingCollection (unpooled, tables by name, sized by the data's loaders)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional

from dlrmtrain.config import checks
from dlrmtrain.config.loader import ConfigError
from dlrmtrain.config.schema import Config
from dlrmtrain.mlperf import benchmarks
from dlrmtrain.workloads.base import Workload

if TYPE_CHECKING:
    import torch
    from torch import nn
    from dlrmtrain.comm.placement import Placement
    from dlrmtrain.distributed.sharding import ShardedModel
    from torchrec.distributed.types import ModuleSharder

    from dlrmtrain.data.datasets import Datasets
    from dlrmtrain.models.activation_memory import ActivationMemory

SEQUENCE_SOURCES = ("synthetic_yambda", "yambda")
"""data.SEQUENCE_SOURCES (named here so reading a family's facts imports no data loader;
tests/config/test_workloads.py holds the two equal)."""

UNUSED_BY_DLRMV4 = (
    "model.bottom_mlp", "model.top_mlp", "model.dcn_num_layers", "model.dcn_low_rank_dim",
    "data.table_sizes", "data.num_dense_features", "data.multi_hot_sizes", "data.synthetic",
    "data.path", "data.format", "data.split", "data.train_parts", "data.eval_parts",
    "data.eval_fraction", "data.shuffle_batches", "data.prefetch_batches",
    "data.multi_hot_cache_dir", "data.verify", "data.verify_max_gb",
)
"""DLRM keys the DLRMv4 path (HSTU model, Yambda loaders) has no use for: set to anything
but their default, they are refused rather than dropped (widths: model.hstu; the
sequence data: data.yambda)."""


class Dlrmv4Workload(Workload):
    arch = "dlrmv4_hstu"
    family = "DLRMv4"
    sources = SEQUENCE_SOURCES
    benchmark = benchmarks.DLRMV4
    collection_kind = "sequence"
    model_scopes_its_own_autocast = True  # the user tower only, as the reference (precision.py)
    rows_follow_precision = False  # the reference's tables emit fp32; a lossy wire is a codec
    unused_keys = UNUSED_BY_DLRMV4
    shrink_tables = ("shrink the data's tables (data.yambda.cross_rows, data.yambda.synthetic's "
                     "catalog) or model.embedding_dim")

    def check_data(self, cfg: Config, world_size: int) -> None:
        from dlrmtrain.data import checks as data_checks
        from dlrmtrain.data.yambda.checks import check_yambda_data  # the yambda package: DLRMv4 configs only

        check_yambda_data(cfg.data, cfg.run.global_batch_size, world_size)
        data_checks.check_sequence_model_fits(cfg)

    def check_model(self, cfg: Config) -> None:
        checks.check_unused_keys(cfg, self.arch, self.unused_keys,
                                 {"model": "model.hstu", "data": "data.yambda"})
        checks.check_hstu_model(cfg)

    def check_device(self, cfg: Config, device_type: str) -> None:
        checks.check_hstu_attention(cfg, device_type)

    def table_names(self, cfg: Config) -> list[str]:
        from dlrmtrain.sequence_features import TABLES

        return list(TABLES)

    def check_sharding(self, cfg: Config) -> None:
        """data_parallel serves one table read once per sample (uid or a cross), no more.
        TorchRec looks every replicated table up in one fbgemm dense kernel, whose CPU forward
        pools (no unpooled CPU kernel): one row per sample and feature, sample-major. TorchRec
        reads that as a row per id, feature-major: right only for a single feature of one id
        per sample. A history feature (one id per past event) fails in TorchRec's
        construct_jagged_tensors; two replicated features get each other's rows, silently.
        Refused on CUDA too, where no run has checked it."""
        from dlrmtrain.sequence_features import HISTORY_FEATURES, TABLES

        sharding = cfg.sharding
        once_per_sample = [t for t, (_rows, features) in TABLES.items() if not set(features) & set(HISTORY_FEATURES)]
        replicated = [t for t in TABLES if sharding.tables.get(t, sharding.default_type) == "data_parallel"]
        history = [t for t in replicated if t not in once_per_sample]
        if history:
            refused, why = history, ("fbgemm's dense CPU lookup sums each sample's history into one "
                                     "row, and TorchRec's construct_jagged_tensors fails on it")
        elif len(replicated) > 1:
            refused, why = replicated[1:], (
                f"TorchRec looks every replicated table up in one fbgemm dense kernel, whose CPU "
                f"forward returns the rows sample by sample where TorchRec reads them feature by "
                f"feature: each feature would get another's rows (beside {replicated[0]})")
        else:
            return
        listed = [t for t in refused if t in sharding.tables]
        key, refused = (f"sharding.tables.{listed[0]}", listed[:1]) if listed else ("sharding.default_type", refused)
        named = ", ".join(f"{t} (features {', '.join(TABLES[t][1])})" for t in refused)
        raise ConfigError(
            f"{key}: data_parallel cannot serve {self.family}'s table{'s' * (len(refused) > 1)} {named}: "
            f"{why}; data_parallel serves at most one table, one read once per sample "
            f"({', '.join(once_per_sample)}); give {', '.join(refused)} table_wise, row_wise or column_wise")

    def activation_memory(self, cfg: Config, rows: Mapping[str, int], local_batch: int,
                          device_type: str) -> ActivationMemory:
        """At full fill: every sample as long as the longest sequence the data yields."""
        from dlrmtrain.models.hstu.activations import attention_kind, hstu_activation_memory

        h = cfg.model.hstu
        rows_per_sample = min(cfg.data.yambda.max_seq_len, h.max_seq_len)
        return hstu_activation_memory(h, cfg.model.embedding_dim, local_batch, rows_per_sample,
                                      cfg.precision.mode, attention_kind(h, device_type))

    def planned_table_rows(self, cfg: Config) -> dict[str, int]:
        from dlrmtrain.data.yambda.builder import planned_table_rows

        return planned_table_rows(cfg.data)

    def lighter_settings(self, cfg: Config, device_type: str) -> list[tuple[str, Config]]:
        """The jagged attention for the padded one: the same model (up to fp32 summation order),
        O(tokens) memory instead of [B, H, N, N] scores."""
        from dlrmtrain.models.hstu.activations import attention_kind, with_attention

        if attention_kind(cfg.model.hstu, device_type) != "padded":
            return []
        kind = "triton" if device_type == "cuda" else "blocked"
        return [(f"model.hstu.attention={kind}", with_attention(cfg, kind))]

    def embedding_sharder(self, cfg: Config, device_type: str) -> tuple[ModuleSharder, str]:
        from dlrmtrain.distributed.sharding import build_ec_sharder
        from dlrmtrain.optim.fused import fused_params
        from dlrmtrain.models.hstu.model import EMBEDDING_COLLECTION

        return (build_ec_sharder(cfg.comm, fused_params(cfg.optim, self.table_precision(cfg), device_type),
                                 device_type), EMBEDDING_COLLECTION)

    def build_datasets(self, cfg: Config, rank: int, world_size: int,
                       pin_memory: bool = False) -> Datasets:
        from dlrmtrain.data.datasets import build_sequence_datasets

        return build_sequence_datasets(cfg, rank, world_size, pin_memory)

    def build_model(self, cfg: Config, rows: Optional[Mapping[str, int]],
                    dense_device: torch.device) -> nn.Module:
        """`rows` None: the reference's tables capped at model.max_table_rows."""
        from dlrmtrain.models import build_hstu_model

        if rows is not None and not isinstance(rows, Mapping):
            raise TypeError("dlrmv4_hstu takes its table rows as {table name: rows} (or None)")
        return build_hstu_model(cfg, dense_device, rows)

    def shard(self, model: nn.Module, cfg: Config, device: torch.device,
              world_size: int, placement: Placement) -> ShardedModel:
        from dlrmtrain.distributed.sharding import shard_sequence_model
        from dlrmtrain.models.hstu.model import EMBEDDING_COLLECTION
        from dlrmtrain.optim.fused import fused_params

        return shard_sequence_model(model, EMBEDDING_COLLECTION, cfg.sharding, placement,
                                    fused_params(cfg.optim, self.table_precision(cfg), device.type), device,
                                    world_size, ddp_bucket_mb=cfg.run.ddp_bucket_mb)


DLRMV4 = Dlrmv4Workload()
