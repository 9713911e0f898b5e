"""What differs per model family, in one place: a Workload per `model.arch` that
validation and the trainer's builders ask.

    base.py      the Workload interface: sources, resolution, checks, builders
    dlrm.py      DLRM (dlrm_v1, dlrm_dcnv2): Criteo rows, pooled EmbeddingBagCollection
    dlrmv4.py    DLRMv4 (dlrmv4_hstu): Yambda sequences, sequence EmbeddingCollection
    registry.py  model.arch → workload (`register`, `workload_of`, `workload_named`)

Everything outside this package that depends on the family asks its workload (its MLPerf
benchmark, autocast scope, table widths and memory check, unused keys, what its
all-to-alls carry) instead of reading `model.arch`. Importing it brings no torch
(base.py says why).

data/ (one builder per kind of source: rows, sequences) and models/ (one per model)
sit below this package and never choose between their builders; the workload does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional

from dlrmtrain.config.schema import Config
from dlrmtrain.workloads.base import Workload
from dlrmtrain.workloads.registry import register, workload_named, workload_of, workload_of_saved

if TYPE_CHECKING:
    import torch
    from torch import nn
    from dlrmtrain.comm.placement import Placement
    from dlrmtrain.data.datasets import Datasets
    from dlrmtrain.distributed.sharding import ShardedModel


def build_datasets(cfg: Config, rank: int, world_size: int, pin_memory: bool = False) -> Datasets:
    """This rank's train and eval batches, read as `model.arch`'s workload says; in
    pinned memory with `pin_memory` (a GPU run: data.loader.pins_for)."""
    return workload_of(cfg).build_datasets(cfg, rank, world_size, pin_memory)


def build_model(cfg: Config, rows: Optional[Mapping[str, int]], dense_device: torch.device) -> nn.Module:
    """The training module for `model.arch` (forward(batch) → (loss, (loss, logits, labels))),
    tables on the meta device. `rows`: table → rows in the model's table order
    (`dlrmv4_hstu` also takes None: the reference's, capped at model.max_table_rows)."""
    return workload_of(cfg).build_model(cfg, rows, dense_device)


def build_sharded_model(cfg: Config, rows: dict[str, int], device: torch.device,
                        world_size: int, placement: Placement | None = None) -> ShardedModel:
    """`model.arch` built with tables on meta, sharded by DistributedModelParallel (with the
    configured codecs where the run's `placement` puts them; None: the config's), its tables
    initialised from `run.seed` the same for any world size. `rows`: table → rows, in the
    model's table order. Returns the model, its plan text and the run's all-to-all counters."""
    from dlrmtrain.comm.placement import Placement
    from dlrmtrain.models.embedding_init import init_embeddings

    workload = workload_of(cfg)
    placement = placement or Placement(cfg.comm, workload.collection_kind)
    sharded = workload.shard(workload.build_model(cfg, rows, device), cfg, device, world_size, placement)
    init_embeddings(sharded.model, rows, cfg.run.seed)
    return sharded


__all__ = ["Workload", "build_datasets", "build_model", "build_sharded_model", "register",
           "workload_named", "workload_of", "workload_of_saved"]
