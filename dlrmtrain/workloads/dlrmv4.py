"""DLRMv4 (`dlrmv4_hstu`): Yambda sequences (`synthetic_yambda`, `yambda`) into a sequence
EmbeddingCollection (unpooled, tables by name, sized by the data's loaders)."""

from __future__ import annotations

from typing import Mapping, Optional

import torch
from torch import nn
from torchrec.distributed.model_parallel import DistributedModelParallel

from dlrmtrain.comm.embedding import validate_sequence_dedup_at
from dlrmtrain.config import checks
from dlrmtrain.config.loader import ConfigError
from dlrmtrain.config.schema import Config
from dlrmtrain.data import SEQUENCE_SOURCES, Datasets, build_sequence_datasets, checks as data_checks
from dlrmtrain.distributed.sharding import fused_params, shard_sequence_model
from dlrmtrain.models import build_hstu_model
from dlrmtrain.models.hstu.model import EMBEDDING_COLLECTION
from dlrmtrain.sequence_features import TABLES
from dlrmtrain.workloads.base import Workload


class Dlrmv4Workload(Workload):
    arch = "dlrmv4_hstu"
    sources = SEQUENCE_SOURCES

    def check_data(self, cfg: Config, world_size: int) -> None:
        from dlrmtrain.data.yambda.checks import check_yambda_data  # the yambda package: DLRMv4 configs only

        check_yambda_data(cfg.data, cfg.run.global_batch_size, world_size)
        data_checks.check_sequence_model_fits(cfg)

    def check_model(self, cfg: Config) -> None:
        checks.check_hstu_model(cfg)
        c = cfg.comm
        try:  # comm.dedup_at: source is TorchRec's index dedup of the EmbeddingCollection
            validate_sequence_dedup_at(c.dedup_at, c.codec, c.table_codecs, c.hierarchy)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def table_names(self, cfg: Config) -> list[str]:
        return list(TABLES)

    def check_hierarchy(self, cfg: Config) -> None:
        if cfg.comm.hierarchy == "node":
            raise ConfigError("comm.hierarchy: node covers pooled embeddings (model.arch dlrm_v1 / "
                              "dlrm_dcnv2) only; DLRMv4's sequence embeddings take comm.hierarchy: flat")

    def build_datasets(self, cfg: Config, rank: int, world_size: int,
                       pin_memory: bool = False) -> Datasets:
        return build_sequence_datasets(cfg, rank, world_size, pin_memory)

    def build_model(self, cfg: Config, rows: Optional[Mapping[str, int]],
                    dense_device: torch.device) -> nn.Module:
        """`rows` None: the reference's tables capped at model.max_table_rows."""
        if rows is not None and not isinstance(rows, Mapping):
            raise TypeError("dlrmv4_hstu takes its table rows as {table name: rows} (or None)")
        return build_hstu_model(cfg, dense_device, rows)

    def shard(self, model: nn.Module, cfg: Config, device: torch.device,
              world_size: int) -> tuple[DistributedModelParallel, str]:
        return shard_sequence_model(model, EMBEDDING_COLLECTION, cfg.sharding, cfg.comm,
                                    fused_params(cfg.optim, "fp32", device.type), device,  # fp32 rows (precision.py)
                                    world_size, ddp_bucket_mb=cfg.run.ddp_bucket_mb)


DLRMV4 = Dlrmv4Workload()
