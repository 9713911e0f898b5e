"""DLRM (`dlrm_v1`, `dlrm_dcnv2`): Criteo-shaped rows (`synthetic`, `criteo`) into an
EmbeddingBagCollection (pooled, one table per categorical feature, in feature order)."""

from __future__ import annotations

from typing import Mapping, Optional

import torch
from torch import nn
from torchrec.distributed.model_parallel import DistributedModelParallel

from dlrmtrain.config import checks
from dlrmtrain.config.loader import ConfigError
from dlrmtrain.config.schema import Config
from dlrmtrain.data import ROW_SOURCES, Datasets, build_row_datasets, checks as data_checks
from dlrmtrain.data.metadata import apply_dataset_metadata
from dlrmtrain.distributed.sharding import fused_params, shard_model
from dlrmtrain.features import TABLE_NAMES
from dlrmtrain.models import build_dlrm_model
from dlrmtrain.workloads.base import Workload


class DlrmWorkload(Workload):
    sources = ROW_SOURCES

    def __init__(self, arch: str):
        self.arch = arch

    def resolve(self, cfg: Config) -> None:
        apply_dataset_metadata(cfg)  # null table / bag sizes from the dataset or the synthetic profile

    def unresolved_keys(self, cfg: Config) -> list[str]:
        return ["data.table_sizes"] if cfg.data.table_sizes is None else []

    def check_data(self, cfg: Config, world_size: int) -> None:
        data_checks.check_config(cfg)

    def check_model(self, cfg: Config) -> None:
        checks.check_dlrm_model(cfg)
        if cfg.comm.dedup_at == "source":
            raise ConfigError("comm.dedup_at: source is built for DLRMv4's sequence embeddings only; "
                              "pooled tables take comm.dedup_at: owner")

    def table_names(self, cfg: Config) -> list[str]:
        return TABLE_NAMES[:len(cfg.data.table_sizes)]

    def build_datasets(self, cfg: Config, rank: int, world_size: int,
                       pin_memory: bool = False) -> Datasets:
        return build_row_datasets(cfg, rank, world_size, pin_memory)

    def build_model(self, cfg: Config, rows: Optional[Mapping[str, int]],
                    dense_device: torch.device) -> nn.Module:
        if not isinstance(rows, Mapping):
            raise TypeError(f"{self.arch} takes its table rows as {{table name: rows}}")
        return build_dlrm_model(cfg, list(rows.values()), dense_device)

    def shard(self, model: nn.Module, cfg: Config, device: torch.device,
              world_size: int) -> tuple[DistributedModelParallel, str]:
        return shard_model(model, cfg.sharding, cfg.comm,
                           fused_params(cfg.optim, cfg.precision.mode, device.type), device, world_size,
                           ddp_bucket_mb=cfg.run.ddp_bucket_mb)


DLRM_V1 = DlrmWorkload("dlrm_v1")
DLRM_DCNV2 = DlrmWorkload("dlrm_dcnv2")
