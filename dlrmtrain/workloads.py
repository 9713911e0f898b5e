"""What differs between the model families one Trainer runs: how the single-device
model is built and sharded.

DLRM (`dlrm_v1`, `dlrm_dcnv2`) keeps its tables in an EmbeddingBagCollection
(pooled, one row list per table in feature order); DLRMv4 (`dlrmv4_hstu`) in a
sequence EmbeddingCollection (unpooled, tables by name). Everything else — the
step, evaluation (every model returns `(loss, (loss, logits, labels))`),
checkpoints, records — is the same code for both.
"""

from __future__ import annotations

import torch
from torchrec.distributed.model_parallel import DistributedModelParallel

from dlrmtrain.config.schema import Config
from dlrmtrain.distributed.sharding import fused_params, shard_model, shard_sequence_model
from dlrmtrain.models import build_model
from dlrmtrain.models.embedding_init import init_embeddings
from dlrmtrain.models.hstu.model import EMBEDDING_COLLECTION


def _sharded_dlrm(cfg: Config, rows: dict[str, int], device: torch.device,
                  world_size: int) -> tuple[DistributedModelParallel, str]:
    model = build_model(cfg, list(rows.values()), device)
    return shard_model(model, cfg, device, world_size)


def _sharded_hstu(cfg: Config, rows: dict[str, int], device: torch.device,
                  world_size: int) -> tuple[DistributedModelParallel, str]:
    model = build_model(cfg, rows, device)
    return shard_sequence_model(model, EMBEDDING_COLLECTION, cfg.sharding, cfg.comm,
                                fused_params(cfg.optim, "fp32", device.type), device,  # fp32 rows (precision.py)
                                world_size, ddp_bucket_mb=cfg.run.ddp_bucket_mb)


_SHARDED_BUILDERS = {"dlrm_v1": _sharded_dlrm, "dlrm_dcnv2": _sharded_dlrm,
                     "dlrmv4_hstu": _sharded_hstu}


def build_sharded_model(cfg: Config, rows: dict[str, int], device: torch.device,
                        world_size: int) -> tuple[DistributedModelParallel, str]:
    """`model.arch` built with tables on meta, sharded by DistributedModelParallel (with the
    configured codecs), its tables initialised from `run.seed` the same for any world size.
    `rows`: table → rows, in the model's table order. Returns the model and its plan text."""
    dmp, plan_text = _SHARDED_BUILDERS[cfg.model.arch](cfg, rows, device, world_size)
    init_embeddings(dmp, rows, cfg.run.seed)
    return dmp, plan_text
