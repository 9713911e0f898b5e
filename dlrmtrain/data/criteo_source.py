"""Data source `criteo`: Criteo files on disk -> this rank's train and eval loaders.

Reads any supported layout (see sources.py), splits it (splits.py), turns one-hot
ids into MLPerf DCNv2 bags when `data.multi_hot_sizes` is set and the files are
one-hot (preprocess/multi_hot.py), and folds ids into the model's table rows when the model's
tables are smaller than the data's vocabulary (`model.max_table_rows`).
Training drops the last incomplete global batch, as the MLPerf references do (the
train loader's `dropped_rows` says how many); evaluation pads it with weight-0 rows
so every real sample is scored exactly once.
"""

from __future__ import annotations

from typing import Sequence

from dlrmtrain.config.schema import Config, DataConfig
from dlrmtrain.data.formats.binary import read_manifest, verify_dataset_checksums
from dlrmtrain.data.loader import CriteoBatchLoader, CriteoLoaderSpec
from dlrmtrain.data.preprocess.multi_hot import MultiHotLookup, MultiHotPart
from dlrmtrain.data.parts import Part
from dlrmtrain.data.prefetch import workers_for
from dlrmtrain.data.sources import detect_format, open_parts
from dlrmtrain.data.splits import fraction_split, mlperf_split, names_split


def split_parts(data: DataConfig) -> tuple[list[Part], list[Part]]:
    if data.path is None:
        raise ValueError("data.path: source 'criteo' needs the dataset directory")
    parts = open_parts(data.path, data.format)
    if data.split == "mlperf":
        return mlperf_split(parts)
    if data.split == "names":
        return names_split(parts, data.train_parts, data.eval_parts)
    if data.split == "fraction":
        return fraction_split(parts, data.eval_fraction)
    raise ValueError(f"data.split: unknown split {data.split!r}; expected mlperf, names or fraction")


def _format(data: DataConfig) -> str:
    assert data.path is not None
    return detect_format(data.path) if data.format == "auto" else data.format


def _check_vocabulary_fits(data: DataConfig) -> None:
    """A preprocessed dataset states its table sizes: the config must have room for every id."""
    if _format(data) != "dlrmtrain":
        return
    stored = read_manifest(data.path)["table_sizes"]
    for t, (have, need) in enumerate(zip(data.table_sizes, stored)):
        if have < need:
            raise ValueError(f"data.table_sizes[{t}]: {have} rows, but {data.path} has {need} distinct ids "
                             f"for that table; use the dataset's sizes {stored}")


def _with_multi_hot(parts: Sequence[Part], data: DataConfig, lookup: MultiHotLookup | None) -> list[Part]:
    if lookup is None:
        return list(parts)
    return [p if isinstance(p.read(0, 0).sparse, list) else MultiHotPart(p, lookup) for p in parts]


def build_criteo_loaders(
    cfg: Config, rank: int, world_size: int, model_rows: list[int],
) -> tuple[CriteoBatchLoader, CriteoBatchLoader]:
    """(train loader, eval loader) for this rank."""
    data = cfg.data
    train_parts, eval_parts = split_parts(data)
    _check_vocabulary_fits(data)
    if data.verify and _format(data) == "dlrmtrain":  # corrupt bytes: a named error, not bad ids
        verify_dataset_checksums(data.path, rank, world_size, data.verify_max_gb * 1e9)
    lookup = None
    if data.multi_hot_sizes is not None:
        lookup = MultiHotLookup(data.table_sizes, data.multi_hot_sizes, cache_dir=data.multi_hot_cache_dir)
    # Ids of a preprocessed dataset are < its table sizes (checked above); any other layout
    # or a smaller model gets `id % rows`, as the MLPerf DCNv2 reference applies `% num_embeddings`.
    fold = None if _format(data) == "dlrmtrain" and model_rows == list(data.table_sizes) else model_rows
    common = dict(rank=rank, world_size=world_size, prefetch=data.prefetch_batches, fold_to_rows=fold,
                  table_rows=model_rows, workers=workers_for(data.workers, data.prefetch_batches))
    train = CriteoBatchLoader(_with_multi_hot(train_parts, data, lookup), CriteoLoaderSpec(
        cfg.run.global_batch_size, shuffle=data.shuffle_batches, seed=cfg.run.seed, last_batch="drop",
        **common))
    evaluation = CriteoBatchLoader(_with_multi_hot(eval_parts, data, lookup),
                                   CriteoLoaderSpec(cfg.eval.batch_size, last_batch="pad", **common))
    return train, evaluation
