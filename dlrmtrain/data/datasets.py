"""Datasets: what the trainer gets from the data, built for one rank from a row source
(`build_row_datasets`) or a sequence source (`build_sequence_datasets`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Union

import torch
from torchrec.datasets.utils import Batch

from dlrmtrain.config.schema import Config
from dlrmtrain.data.criteo_source import build_criteo_loaders
from dlrmtrain.data.loader import CriteoBatchLoader
from dlrmtrain.data.synthetic.generator import tables_and_exponents
from dlrmtrain.data.synthetic.source import build_synthetic_loaders
from dlrmtrain.features import TABLE_NAMES
from dlrmtrain.sequence_features import SequenceBatch

_ROW_LOADERS = {"synthetic": build_synthetic_loaders, "criteo": build_criteo_loaders}

ROW_SOURCES = tuple(_ROW_LOADERS)
"""The sources of rows (TorchRec `Batch`es of Criteo's layout): `build_row_datasets`."""
SEQUENCE_SOURCES = ("synthetic_yambda", "yambda")
"""The sources of sequences (`SequenceBatch`es): `build_sequence_datasets`."""


@dataclass
class Datasets:
    """What the trainer needs from the data, already sliced for one rank."""

    train_batches: Callable[[int, int], Iterable[Union[Batch, SequenceBatch]]]
    """(epoch, first batch) → this rank's training batches of that epoch from that batch on."""
    eval_batches: Callable[[], Iterable[tuple[Union[Batch, SequenceBatch], torch.Tensor]]]
    """→ this rank's evaluation batches with per-sample weights (0 = padding)."""
    num_train_samples: int
    num_eval_samples: int
    steps_per_epoch: int
    table_rows: dict[str, int]
    """Embedding table → rows, in the model's table order (ids of the data are below them)."""
    set_sparse_transform: Optional[Callable[..., None]] = None
    """Where the source has one (the row and sequence loaders): sets a KJT → KJT transform that every
    train and eval batch takes where it is made (dedup at the source: comm/placement.py), before its first batch;
    `keep_full=True` keeps the full KJT too (the transform's goes to `distinct_features`, on a
    sequence batch `distinct_sparse`: comm.codec auto at the source)."""


def data_table_sizes(cfg: Config) -> list[int]:
    """The data's cardinality per table: a synthetic profile's sizes, else data.table_sizes."""
    if cfg.data.source == "synthetic":
        return tables_and_exponents(cfg.data)[0]
    return list(cfg.data.table_sizes)


def table_rows(cfg: Config) -> list[int]:
    """Rows of each embedding table: the data's cardinality, capped by model.max_table_rows."""
    cap = cfg.model.max_table_rows
    return [min(n, cap) if cap else n for n in data_table_sizes(cfg)]


def _transform_setter(*loaders: Any) -> Callable[..., None]:
    """`Datasets.set_sparse_transform` for these loaders (train and eval): each takes the
    transform, and `keep_full` says whether the full KJT stays beside the transform's."""
    def set_sparse_transform(transform: Callable, keep_full: bool = False) -> None:
        for loader in loaders:
            loader.sparse_transform, loader.keep_full_batch = transform, keep_full
    return set_sparse_transform


def _datasets(train: CriteoBatchLoader, evaluation: CriteoBatchLoader, rows: list[int],
              pin_memory: bool) -> Datasets:
    train.pin_memory = evaluation.pin_memory = pin_memory

    def train_for_epoch(epoch: int, start: int = 0) -> Iterable[Batch]:
        train.set_epoch(epoch)
        return train.batches_from(start)

    return Datasets(
        train_batches=train_for_epoch,
        eval_batches=evaluation.iter_weighted,
        num_train_samples=train.source.rows,
        num_eval_samples=evaluation.source.rows,
        steps_per_epoch=train.full_batches,
        table_rows=dict(zip(TABLE_NAMES, rows)),
        set_sparse_transform=_transform_setter(train, evaluation),
    )


def build_sequence_datasets(cfg: Config, rank: int, world_size: int,
                            pin_memory: bool = False) -> Datasets:
    """This rank's train and eval batches of a sequence source, read by yambda/; in
    pinned memory with `pin_memory` (a GPU run: loader.pins_for)."""
    from dlrmtrain.data.yambda import build_yambda_loaders  # the sequence data path: its runs only

    loaders = build_yambda_loaders(cfg.data, rank, world_size, cfg.run.global_batch_size,
                                   cfg.eval.batch_size)
    loaders.train.pin_memory = loaders.eval.pin_memory = pin_memory
    return Datasets(
        train_batches=lambda epoch, start=0: loaders.train.batches_from(start),
        eval_batches=loaders.eval.iter_weighted,
        num_train_samples=loaders.train.num_real_samples,
        num_eval_samples=loaders.eval.num_real_samples,
        steps_per_epoch=loaders.train.num_batches,
        table_rows=dict(loaders.table_rows),
        set_sparse_transform=_transform_setter(loaders.train, loaders.eval),
    )


def build_row_datasets(cfg: Config, rank: int, world_size: int,
                       pin_memory: bool = False) -> Datasets:
    """This rank's train and eval batches of a row source, through one loader; in
    pinned memory with `pin_memory` (a GPU run: loader.pins_for)."""
    build_loaders = _ROW_LOADERS.get(cfg.data.source)
    if build_loaders is None:  # the workload's source check refuses it first
        raise ValueError(f"data.source: {cfg.data.source!r} is not a source of rows "
                         f"({', '.join(ROW_SOURCES)})")
    rows = table_rows(cfg)
    return _datasets(*build_loaders(cfg, rank, world_size, rows), rows, pin_memory)
