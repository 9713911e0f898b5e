"""The data section's rules: tables against the Criteo feature layout, source settings."""

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


def check_config(cfg: Config) -> None:
    """Raise ConfigError naming the data key for any impossible combination."""
    data = cfg.data
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
