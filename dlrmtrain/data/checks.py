"""The data section's rules: the row sources' tables against the Criteo feature layout
and their settings; the sequence sources against the model (their own settings:
yambda/checks.py). Which source feeds which model is the workload's (dlrmtrain/workloads/)."""

from __future__ import annotations

from dlrmtrain.config.loader import ConfigError
from dlrmtrain.config.schema import Config, DataConfig
from dlrmtrain.features import NUM_DENSE, NUM_SPARSE


def _check_criteo_source(data: DataConfig) -> None:
    if not data.path:
        raise ConfigError("data.path: source 'criteo' needs the dataset directory")
    if data.split == "names" and not (data.train_parts and data.eval_parts):
        raise ConfigError("data.train_parts / data.eval_parts: split 'names' needs both lists")
    if not 0.0 <= data.eval_fraction < 1.0:
        raise ConfigError(f"data.eval_fraction: must be in [0, 1), got {data.eval_fraction}")
    if data.num_dense_features != NUM_DENSE:
        raise ConfigError(f"data.num_dense_features: Criteo files have {NUM_DENSE} dense features")


def check_workers(data: DataConfig) -> None:
    """data.workers: at least one, and more only where batches are made ahead."""
    if data.workers is None:
        return
    if data.workers < 1:
        raise ConfigError(f"data.workers: must be at least 1 (or null: sized from the cores), got {data.workers}")
    if data.workers == 1:
        return
    if data.source == "synthetic":
        raise ConfigError(f"data.workers: {data.workers} workers, but source 'synthetic' holds its rows "
                          "in memory and makes no batch ahead; leave it null or 1")
    sequences = data.source in ("yambda", "synthetic_yambda")
    key = "data.yambda.prefetch_batches" if sequences else "data.prefetch_batches"
    prefetch = data.yambda.prefetch_batches if sequences else data.prefetch_batches
    if prefetch < 1:
        raise ConfigError(f"data.workers: {data.workers} workers make batches ahead, but {key} is "
                          f"{prefetch} (batches made where they are read); raise it or leave data.workers null")


def check_config(cfg: Config) -> None:
    """A row source's data section: raise ConfigError naming the key for any impossible combination."""
    data = cfg.data
    check_workers(data)
    if len(data.table_sizes) != NUM_SPARSE:
        raise ConfigError(f"data.table_sizes: {len(data.table_sizes)} tables given, but Criteo "
                          f"data has {NUM_SPARSE} categorical features")
    for i, size in enumerate(data.table_sizes):
        if size < 1:
            raise ConfigError(f"data.table_sizes[{i}]: a table needs at least one row, got {size}")
    if data.num_dense_features < 1:
        raise ConfigError("data.num_dense_features: must be at least 1")
    if data.multi_hot_sizes is not None:
        if len(data.multi_hot_sizes) != len(data.table_sizes):
            raise ConfigError(f"data.multi_hot_sizes: {len(data.multi_hot_sizes)} entries for "
                              f"{len(data.table_sizes)} tables")
        if any(k < 1 for k in data.multi_hot_sizes):
            raise ConfigError("data.multi_hot_sizes: every bag size must be at least 1")
    if data.source == "criteo":
        _check_criteo_source(data)
    syn = data.synthetic
    if not 0.0 < syn.scale <= 1.0:
        raise ConfigError(f"data.synthetic.scale: must be in (0, 1], got {syn.scale}")
    if data.source == "synthetic" and syn.num_train_samples < cfg.run.global_batch_size:
        raise ConfigError(f"data.synthetic.num_train_samples: {syn.num_train_samples} is less "
                          f"than one global batch ({cfg.run.global_batch_size})")
    if cfg.eval.enabled and syn.num_eval_samples < 1:
        raise ConfigError("data.synthetic.num_eval_samples: must be positive when eval is enabled")


def check_sequence_model_fits(cfg: Config) -> None:
    """A sequence source against the model: sequences fit, tables are sized by the data."""
    check_workers(cfg.data)
    data_len, model_len = cfg.data.yambda.max_seq_len, cfg.model.hstu.max_seq_len
    if data_len > model_len:
        raise ConfigError(f"data.yambda.max_seq_len: {data_len} exceeds model.hstu.max_seq_len "
                          f"{model_len}; the model would refuse the longest samples")
    if cfg.model.max_table_rows is not None:
        raise ConfigError("model.max_table_rows: the Yambda sources size every table from the "
                          "data (ids are not folded); set it null and shrink the data instead "
                          "(data.yambda.cross_rows, data.yambda.synthetic's catalog)")
    if cfg.data.table_sizes is not None:
        raise ConfigError("data.table_sizes: the Yambda sources size their tables themselves; "
                          "leave it null")
