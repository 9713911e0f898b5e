"""DLRM (`dlrm_v1`, `dlrm_dcnv2`): Criteo-shaped rows (`synthetic`, `criteo`) into an
EmbeddingBagCollection (pooled, one table per categorical feature, in feature order).

The two differ in the interaction (v1: dot products, with the MLPerf v1 reference's
init of the MLPs; DCNv2: a low-rank cross net, torchrec's init) and in their MLPerf
benchmark."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional

from dlrmtrain.config import checks
from dlrmtrain.config.schema import Config
from dlrmtrain.features import TABLE_NAMES
from dlrmtrain.mlperf import benchmarks
from dlrmtrain.workloads.base import Workload

if TYPE_CHECKING:
    import torch
    from torch import nn
    from dlrmtrain.comm.placement import Placement
    from dlrmtrain.distributed.sharding import ShardedModel
    from torchrec.distributed.types import ModuleSharder
    from torchrec.models.dlrm import DLRMTrain

    from dlrmtrain.data.datasets import Datasets
    from dlrmtrain.models.activation_memory import ActivationMemory

ROW_SOURCES = ("synthetic", "criteo")
"""data.ROW_SOURCES (named here so reading a family's facts imports no data loader;
tests/config/test_workloads.py holds the two equal)."""


class DlrmWorkload(Workload):
    family = "DLRM"
    sources = ROW_SOURCES
    shrink_tables = "lower data.table_sizes (or cap them with model.max_table_rows)"

    def __init__(self, arch: str, benchmark: str, cross_net: bool):
        self.arch = arch
        self.benchmark = benchmark
        self.cross_net = cross_net
        """False: dot interaction (v1); True: DCNv2's low-rank cross net (models/dlrm.py)."""

    def resolve(self, cfg: Config) -> None:
        from dlrmtrain.data.metadata import apply_dataset_metadata

        apply_dataset_metadata(cfg)  # null table / bag sizes from the dataset or the synthetic profile

    def unresolved_keys(self, cfg: Config) -> list[str]:
        return ["data.table_sizes"] if cfg.data.table_sizes is None else []

    def check_data(self, cfg: Config, world_size: int) -> None:
        from dlrmtrain.data import checks as data_checks

        data_checks.check_config(cfg)

    def check_model(self, cfg: Config) -> None:
        checks.check_dlrm_model(cfg)

    def table_names(self, cfg: Config) -> list[str]:
        return TABLE_NAMES[:len(cfg.data.table_sizes)]

    def activation_memory(self, cfg: Config, rows: Mapping[str, int], local_batch: int,
                          device_type: str) -> ActivationMemory:
        from dlrmtrain.models.dlrm_activations import dlrm_activation_memory

        copied = self.dense_parameters(cfg, rows) if cfg.precision.mode == "bf16" else 0  # autocast's copies
        return dlrm_activation_memory(cfg.model, cfg.data.num_dense_features, len(rows), local_batch,
                                      cfg.precision.mode, self.cross_net, copied)

    def planned_table_rows(self, cfg: Config) -> dict[str, int]:
        from dlrmtrain.data.datasets import table_rows

        return dict(zip(self.table_names(cfg), table_rows(cfg)))

    def embedding_sharder(self, cfg: Config, device_type: str) -> tuple[ModuleSharder, str]:
        from dlrmtrain.distributed.planner import EBC_PATH
        from dlrmtrain.distributed.sharding import build_ebc_sharder
        from dlrmtrain.optim.fused import fused_params

        return (build_ebc_sharder(cfg.comm, fused_params(cfg.optim, self.table_precision(cfg), device_type),
                                  device_type),
                EBC_PATH)

    def build_datasets(self, cfg: Config, rank: int, world_size: int,
                       pin_memory: bool = False) -> Datasets:
        from dlrmtrain.data.datasets import build_row_datasets

        return build_row_datasets(cfg, rank, world_size, pin_memory)

    def build_model(self, cfg: Config, rows: Optional[Mapping[str, int]],
                    dense_device: torch.device) -> nn.Module:
        if not isinstance(rows, Mapping):
            raise TypeError(f"{self.arch} takes its table rows as {{table name: rows}}")
        return self.build_dlrm(cfg, list(rows.values()), dense_device)

    def build_dlrm(self, cfg: Config, rows: list[int], dense_device: torch.device) -> DLRMTrain:
        """The model from rows in feature order (models/dlrm.build_model)."""
        from dlrmtrain.models import build_dlrm_model

        return build_dlrm_model(cfg, rows, dense_device, cross_net=self.cross_net)

    def shard(self, model: nn.Module, cfg: Config, device: torch.device,
              world_size: int, placement: Placement) -> ShardedModel:
        from dlrmtrain.distributed.sharding import shard_model
        from dlrmtrain.optim.fused import fused_params

        return shard_model(model, cfg.sharding, placement,
                           fused_params(cfg.optim, self.table_precision(cfg), device.type), device, world_size,
                           ddp_bucket_mb=cfg.run.ddp_bucket_mb)


DLRM_V1 = DlrmWorkload("dlrm_v1", benchmarks.DLRM, cross_net=False)
DLRM_DCNV2 = DlrmWorkload("dlrm_dcnv2", benchmarks.DLRM_DCNV2, cross_net=True)
_DLRMS = {w.arch: w for w in (DLRM_V1, DLRM_DCNV2)}


def build_dlrm_model(cfg: Config, rows: list[int], dense_device: torch.device) -> DLRMTrain:
    """The DLRM of `cfg`'s arch (v1 or DCNv2) from rows in feature order, tables on meta."""
    return _DLRMS[cfg.model.arch].build_dlrm(cfg, rows, dense_device)
