"""Data: sources of samples and their per-rank batches.

`build_datasets` is the one entry the trainer uses; each data source plugs in
here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional

import numpy as np
import torch
from torchrec.datasets.utils import Batch

from dlrmtrain.config.schema import Config
from dlrmtrain.data.synthetic import generator as synthetic
from dlrmtrain.data.batching import eval_batches, num_train_steps, train_batches
from dlrmtrain.data.criteo_source import build_criteo_loaders


@dataclass
class Datasets:
    """What the trainer needs from the data, already sliced for one rank."""

    train_batches: Callable[[int, int], Iterable[Batch]]
    """(epoch, first batch) → this rank's training batches of that epoch from that batch on."""
    eval_batches: Callable[[], Iterable[tuple[Batch, torch.Tensor]]]
    """→ this rank's evaluation batches with per-sample weights (0 = padding)."""
    num_train_samples: int
    num_eval_samples: int
    steps_per_epoch: int


def data_table_sizes(cfg: Config) -> list[int]:
    """The data's cardinality per table: a synthetic profile's sizes, else data.table_sizes."""
    if cfg.data.source == "synthetic":
        return synthetic.tables_and_exponents(cfg.data)[0]
    return list(cfg.data.table_sizes)


def table_rows(cfg: Config) -> list[int]:
    """Rows of each embedding table: the data's cardinality, capped by model.max_table_rows."""
    cap = cfg.model.max_table_rows
    return [min(n, cap) if cap else n for n in data_table_sizes(cfg)]


def _criteo_datasets(cfg: Config, rank: int, world_size: int, rows: list[int]) -> Datasets:
    train, evaluation = build_criteo_loaders(cfg, rank, world_size, rows)

    def train_for_epoch(epoch: int, start: int = 0) -> Iterable[Batch]:
        train.set_epoch(epoch)
        return train.batches_from(start)

    return Datasets(
        train_batches=train_for_epoch,
        eval_batches=evaluation.iter_weighted,
        num_train_samples=train.source.rows,
        num_eval_samples=evaluation.source.rows,
        steps_per_epoch=train.full_batches,
    )


def build_datasets(cfg: Config, rank: int, world_size: int) -> Datasets:
    data = cfg.data
    rows = table_rows(cfg)
    offsets: Optional[list[np.ndarray]] = None
    if data.multi_hot_sizes is not None:
        offsets = synthetic.multi_hot_offsets(rows, data.multi_hot_sizes, cfg.run.seed + 7)
    if data.source == "criteo":
        return _criteo_datasets(cfg, rank, world_size, rows)
    if data.source != "synthetic":  # validate_config rejects this earlier
        raise ValueError(f"data.source: unknown source {data.source!r}")
    train = synthetic.generate(data, data.synthetic.num_train_samples, seed=cfg.run.seed + 1)
    evals = synthetic.generate(data, data.synthetic.num_eval_samples, seed=cfg.run.seed + 2)
    gbs, ebs = cfg.run.global_batch_size, cfg.eval.batch_size
    return Datasets(
        train_batches=lambda epoch, start=0: train_batches(
            train, gbs, rank, world_size, rows, epoch_seed=cfg.run.seed * 1000 + epoch,
            multi_hot_offsets=offsets, start_step=start),
        eval_batches=lambda: eval_batches(evals, ebs, rank, world_size, rows, offsets),
        num_train_samples=len(train),
        num_eval_samples=len(evals),
        steps_per_epoch=num_train_steps(len(train), gbs),
    )
