"""DLRM v1 (dot interaction) and DLRM-DCNv2 (low-rank cross net), from torchrec.models.dlrm.

The embedding tables are created on the meta device: DistributedModelParallel
materialises only each rank's shards. Layer counts follow MLPerf even when a
config scales widths down, so the MLPerf log can name every layer.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRMTrain
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from dlrmtrain.config.schema import Config
from dlrmtrain.features import CAT_KEYS, TABLE_NAMES


def table_configs(rows: list[int], embedding_dim: int) -> list[EmbeddingBagConfig]:
    return [EmbeddingBagConfig(name=table, embedding_dim=embedding_dim,
                               num_embeddings=n, feature_names=[key])
            for table, key, n in zip(TABLE_NAMES, CAT_KEYS, rows, strict=True)]


def _mlperf_v1_linear_init(module: nn.Module) -> None:
    """The MLPerf DLRM v1 reference's MLP init: W ~ N(0, sqrt(2 / (fan_in + fan_out))),
    b ~ N(0, sqrt(1 / fan_out))."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            fan_out, fan_in = layer.weight.shape
            with torch.no_grad():
                layer.weight.normal_(0.0, math.sqrt(2.0 / (fan_in + fan_out)))
                layer.bias.normal_(0.0, math.sqrt(1.0 / fan_out))


def build_model(cfg: Config, rows: list[int], dense_device: torch.device) -> DLRMTrain:
    """The training module (model + BCE loss) with its tables on the meta device.

    Dense layers are initialised from `run.seed`, identically on every rank.
    """
    m = cfg.model
    ebc = EmbeddingBagCollection(tables=table_configs(rows, m.embedding_dim),
                                 device=torch.device("meta"))
    torch.manual_seed(cfg.run.seed)
    common = dict(embedding_bag_collection=ebc,
                  dense_in_features=cfg.data.num_dense_features,
                  dense_arch_layer_sizes=list(m.bottom_mlp),
                  over_arch_layer_sizes=list(m.top_mlp),
                  dense_device=dense_device)
    if m.arch == "dlrm_v1":
        dlrm = DLRM(**common)
        _mlperf_v1_linear_init(dlrm.dense_arch)
        _mlperf_v1_linear_init(dlrm.over_arch)
    else:  # dlrm_dcnv2: torchrec's defaults are the MLPerf reference's init
        dlrm = DLRM_DCN(dcn_num_layers=m.dcn_num_layers, dcn_low_rank_dim=m.dcn_low_rank_dim,
                        **common)
        dlrm.inter_arch.to(dense_device)
    return DLRMTrain(dlrm)
