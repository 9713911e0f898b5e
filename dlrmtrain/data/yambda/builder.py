"""`build_yambda_loaders`: one rank's train and eval loaders for the DLRMv4 sources.

`synthetic_yambda`: the generator (synthetic.py), contiguous rank slices (its unique
rates then hold at any world size). `yambda`: a prepared dataset (samples.py), the
reference's streaming order: training windows start_window .. + num_train_windows,
each cut into round-robin rank slices; eval = eval_window's anchors (held-out users'
with train_fraction < 1).
"""

from __future__ import annotations

from dataclasses import dataclass, asdict

import numpy as np

from dlrmtrain.config.schema import DataConfig
from dlrmtrain.data.prefetch import workers_for
from dlrmtrain.data.yambda.calibration import REFERENCE_UNIQUE_RATES, calibrate
from dlrmtrain.data.yambda.checks import check_yambda_data
from dlrmtrain.data.yambda.history import HistoryRule
from dlrmtrain.data.yambda.loader import SequenceBatchLoader, SequenceLoaderSpec, Windows
from dlrmtrain.data.yambda.samples import CrossSpec, SampleRule, YambdaSamples
from dlrmtrain.data.yambda.synthetic import YambdaLikeGenerator, YambdaLikeProfile
from dlrmtrain.sequence_features import CROSS_SPECS, TABLES


@dataclass
class YambdaLoaders:
    train: SequenceBatchLoader
    eval: SequenceBatchLoader
    table_rows: dict[str, int]
    """Rows each table needs for this data (ids are below them)."""


def cross_specs(data: DataConfig) -> list[CrossSpec]:
    """The reference's crosses with data.yambda.cross_rows applied."""
    rows = data.yambda.cross_rows
    return [(name, keys, rows.get(name, n), salt) for name, keys, n, salt in CROSS_SPECS]


def synthetic_profile(data: DataConfig) -> YambdaLikeProfile:
    fields = asdict(data.yambda.synthetic)
    fields.pop("calibrate")
    return YambdaLikeProfile(**fields)


def planned_table_rows(data: DataConfig) -> dict[str, int]:
    """The rows a run's tables get, without reading its data: the synthetic profile's catalog,
    or for the prepared Yambda store the reference's (sequence_features.TABLES: Yambda-5B's
    item, artist, album and user counts), the crosses as data.yambda.cross_rows sets them."""
    if data.source == "synthetic_yambda":
        return YambdaLikeGenerator(synthetic_profile(data), cross_specs(data)).table_rows()
    crosses = {name: rows for name, _keys, rows, _salt in cross_specs(data)}
    return {name: crosses.get(name, rows) for name, (rows, _features) in TABLES.items()}


def _synthetic(data: DataConfig, rank: int, world_size: int, global_batch: int, eval_batch: int,
               prefetch: int) -> YambdaLoaders:
    profile, crosses = synthetic_profile(data), cross_specs(data)
    if data.yambda.synthetic.calibrate:  # same inputs on every rank: same result
        profile = calibrate(profile, crosses, global_batch // world_size, REFERENCE_UNIQUE_RATES).profile
    train_gen, eval_gen = YambdaLikeGenerator(profile, crosses), YambdaLikeGenerator(profile, crosses)
    common = dict(rank=rank, world_size=world_size, slicing="contiguous", prefetch=prefetch,
                  workers=workers_for(data.workers, prefetch))
    return YambdaLoaders(
        train=SequenceBatchLoader([np.arange(train_gen.num_train_samples)], train_gen.columns,
                                  SequenceLoaderSpec(global_batch_size=global_batch, last_batch="drop", **common)),
        eval=SequenceBatchLoader([np.arange(eval_gen.num_eval_samples)],
                                 lambda ids: eval_gen.columns(ids, eval_split=True),
                                 SequenceLoaderSpec(global_batch_size=eval_batch, last_batch="pad", **common)),
        table_rows=train_gen.table_rows())


def _prepared(data: DataConfig, rank: int, world_size: int, global_batch: int, eval_batch: int,
              prefetch: int) -> YambdaLoaders:
    y = data.yambda
    rule = SampleRule(HistoryRule(y.history_length, y.scan_window, y.history_strategy), y.min_history,
                      y.max_seq_len, y.window_seconds, y.shuffle_fraction, y.shuffle_seed, y.train_fraction,
                      y.split_salt)
    train_samples = YambdaSamples(y.path, rule, cross_specs(data))
    eval_samples = YambdaSamples(train_samples.store, rule, cross_specs(data))  # its own thread's state
    train_windows = range(y.start_window, min(y.start_window + y.num_train_windows, train_samples.num_windows))
    windows = Windows(train_samples.train_window_sizes(train_windows),
                      lambda w: train_samples.train_indices(train_windows[w]))
    store = train_samples.store
    common = dict(rank=rank, world_size=world_size, slicing="round_robin", prefetch=prefetch,
                  workers=workers_for(data.workers, prefetch))
    return YambdaLoaders(
        train=SequenceBatchLoader(windows, train_samples.columns, SequenceLoaderSpec(
            global_batch_size=global_batch, last_batch="drop", **common)),
        eval=SequenceBatchLoader([eval_samples.eval_indices(y.eval_window, y.eval_num_windows)],
                                 eval_samples.columns, SequenceLoaderSpec(
                                     global_batch_size=eval_batch, last_batch="pad", **common)),
        table_rows={"item_id": store.num_items, "artist_id": int(np.max(store.item_to_artist, initial=0)) + 1,
                    "album_id": int(np.max(store.item_to_album, initial=0)) + 1, "uid": len(store.user_start),
                    **{name: rows for name, _k, rows, _s in cross_specs(data)}})


def build_yambda_loaders(data: DataConfig, rank: int, world_size: int, global_batch_size: int,
                         eval_global_batch_size: int) -> YambdaLoaders:
    """This rank's loaders for data.source `synthetic_yambda` or `yambda`."""
    check_yambda_data(data, global_batch_size, world_size)
    if eval_global_batch_size % world_size:
        raise ValueError(f"eval batch {eval_global_batch_size} does not divide by {world_size} ranks")
    build = {"synthetic_yambda": _synthetic, "yambda": _prepared}.get(data.source)
    if build is None:
        raise ValueError(f"data.source: {data.source!r} is not a Yambda source")
    return build(data, rank, world_size, global_batch_size, eval_global_batch_size, data.yambda.prefetch_batches)
