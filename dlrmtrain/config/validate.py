"""Cross-field checks of a loaded Config, run before any process group exists."""

from __future__ import annotations

from dlrmtrain.config.loader import ConfigError
from dlrmtrain.config.schema import NUM_CATEGORICAL, Config
from dlrmtrain.data.metadata import apply_dataset_metadata
from dlrmtrain.data.sources import DATA_FORMATS
from dlrmtrain.data.splits import SPLIT_KINDS
from dlrmtrain.data.synthetic.profiles import PROFILES, TERABYTE_TABLES
from dlrmtrain.precision import PRECISIONS

MODEL_ARCHS = ("dlrm_v1", "dlrm_dcnv2")
SHARDING_TYPES = ("table_wise", "column_wise", "row_wise", "data_parallel")
PLANNERS = ("manual", "torchrec")
OPTIMIZERS = ("sgd", "adagrad")
DATA_SOURCES = ("synthetic", "criteo")
DEVICES = ("auto", "cpu", "cuda")


def _one_of(key: str, value: str, allowed: tuple[str, ...] | list[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(allowed)}")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def table_names(cfg: Config) -> list[str]:
    return [f"t_cat_{i}" for i in range(len(cfg.data.table_sizes))]


def _validate_criteo_source(data) -> None:
    if not data.path:
        raise ConfigError("data.path: source 'criteo' needs the dataset directory")
    _one_of("data.format", data.format, DATA_FORMATS)
    _one_of("data.split", data.split, SPLIT_KINDS)
    if data.split == "names" and not (data.train_parts and data.eval_parts):
        raise ConfigError("data.train_parts / data.eval_parts: split 'names' needs both lists")
    if not 0.0 <= data.eval_fraction < 1.0:
        raise ConfigError(f"data.eval_fraction: must be in [0, 1), got {data.eval_fraction}")
    if data.num_dense_features != 13:
        raise ConfigError("data.num_dense_features: Criteo files have 13 dense features")


def validate_config(cfg: Config, world_size: int) -> None:
    """Raise ConfigError naming the key for any impossible combination."""
    from dlrmtrain.comm.registry import available_codecs, validate_codec_choice

    run, data, model = cfg.run, cfg.data, cfg.model
    _one_of("run.device", run.device, DEVICES)
    _one_of("data.source", data.source, DATA_SOURCES)
    _one_of("model.arch", model.arch, MODEL_ARCHS)
    _one_of("optim.name", cfg.optim.name, OPTIMIZERS)
    if cfg.precision.mode == "fp16":
        raise ConfigError("precision.mode: fp16 is not supported: it needs loss scaling, which "
                          "TorchRec's in-backward embedding optimizers cannot honour; use bf16")
    _one_of("precision.mode", cfg.precision.mode, PRECISIONS)
    _one_of("sharding.default_type", cfg.sharding.default_type, SHARDING_TYPES)
    _one_of("comm.codec", cfg.comm.codec, available_codecs())

    if world_size < 1:
        raise ConfigError(f"world size {world_size} must be at least 1")
    if run.global_batch_size <= 0 or run.global_batch_size % world_size:
        raise ConfigError(f"run.global_batch_size: {run.global_batch_size} does not divide "
                          f"evenly over world size {world_size}")
    if cfg.eval.batch_size <= 0 or cfg.eval.batch_size % world_size:
        raise ConfigError(f"eval.batch_size: {cfg.eval.batch_size} does not divide evenly "
                          f"over world size {world_size}")
    if run.epochs <= 0:
        raise ConfigError(f"run.epochs: must be positive, got {run.epochs}")
    if run.max_steps is not None and run.max_steps <= 0:
        raise ConfigError(f"run.max_steps: must be positive or null, got {run.max_steps}")

    _one_of("data.synthetic.profile", data.synthetic.profile, PROFILES)
    apply_dataset_metadata(cfg)  # null sizes come from the data itself (data/metadata.py)
    if len(data.table_sizes) != NUM_CATEGORICAL:
        raise ConfigError(f"data.table_sizes: {len(data.table_sizes)} tables given, but Criteo "
                          f"data has {NUM_CATEGORICAL} categorical features")
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
    syn = data.synthetic
    if data.source == "criteo":
        _validate_criteo_source(data)
    _one_of("data.synthetic.profile", syn.profile, PROFILES)
    _one_of("data.synthetic.terabyte_tables", syn.terabyte_tables, TERABYTE_TABLES)
    if not 0.0 < syn.scale <= 1.0:
        raise ConfigError(f"data.synthetic.scale: must be in (0, 1], got {syn.scale}")
    if data.source == "synthetic" and syn.num_train_samples < run.global_batch_size:
        raise ConfigError(f"data.synthetic.num_train_samples: {syn.num_train_samples} is less "
                          f"than one global batch ({run.global_batch_size})")
    if cfg.eval.enabled and syn.num_eval_samples < 1:
        raise ConfigError("data.synthetic.num_eval_samples: must be positive when eval is enabled")

    if model.bottom_mlp[-1:] != [model.embedding_dim]:
        raise ConfigError(f"model.bottom_mlp: the last width must equal model.embedding_dim "
                          f"({model.embedding_dim}), got {model.bottom_mlp}")
    if model.top_mlp[-1:] != [1]:
        raise ConfigError(f"model.top_mlp: the last width must be 1 (the logit), got {model.top_mlp}")
    if model.max_table_rows is not None and model.max_table_rows < 1:
        raise ConfigError("model.max_table_rows: must be positive or null")

    names = set(table_names(cfg))
    _one_of("sharding.planner", cfg.sharding.planner, PLANNERS)
    for table, rank in cfg.sharding.table_ranks.items():
        if table not in names:
            raise ConfigError(f"sharding.table_ranks.{table}: no such table")
        if not 0 <= rank < world_size:
            raise ConfigError(f"sharding.table_ranks.{table}: rank {rank} is outside the world "
                              f"of {world_size} ranks")
        if cfg.sharding.tables.get(table, cfg.sharding.default_type) != "table_wise":
            raise ConfigError(f"sharding.table_ranks.{table}: only table-wise tables have one rank")
        if cfg.sharding.planner != "manual":
            raise ConfigError(f"sharding.table_ranks.{table}: placements are set by hand only "
                              f"with sharding.planner=manual")
    for table, kind in cfg.sharding.tables.items():
        if table not in names:
            raise ConfigError(f"sharding.tables.{table}: no such table (tables are t_cat_0 … "
                              f"t_cat_{len(names) - 1})")
        _one_of(f"sharding.tables.{table}", kind, SHARDING_TYPES)
    if cfg.sharding.planner == "torchrec" and run.device != "cuda":
        wanted = set(cfg.sharding.tables.values()) | {cfg.sharding.default_type}
        if "row_wise" in wanted and (run.device == "cpu" or not _cuda_available()):
            raise ConfigError("sharding.planner: TorchRec's planner offers no row-wise sharding "
                              "on CPU; use sharding.planner=manual for row-wise tables")
    for table, codec in cfg.comm.table_codecs.items():
        if table not in names:
            raise ConfigError(f"comm.table_codecs.{table}: no such table")
        _one_of(f"comm.table_codecs.{table}", codec, available_codecs())
    # qcomms apply run-wide; fp8 has GPU kernels only (the error names comm.codec)
    device = run.device if run.device != "auto" else ("cuda" if _cuda_available() else "cpu")
    try:
        validate_codec_choice(cfg.comm.codec, cfg.comm.table_codecs, device)
    except ValueError as e:
        raise ConfigError(str(e)) from None

    if cfg.optim.lr <= 0:
        raise ConfigError(f"optim.lr: must be positive, got {cfg.optim.lr}")
    for key in ("warmup_steps", "decay_start_step", "decay_steps"):
        if getattr(cfg.optim, key) < 0:
            raise ConfigError(f"optim.{key}: must not be negative")
    if cfg.checkpoint.every_steps < 0:
        raise ConfigError("checkpoint.every_steps: must not be negative")
    if cfg.checkpoint.keep < 1:
        raise ConfigError("checkpoint.keep: keep at least one checkpoint")
    if cfg.eval.evals_per_epoch < 0:
        raise ConfigError("eval.evals_per_epoch: must not be negative")
    _one_of("mlperf.division", cfg.mlperf.division, ("closed", "open"))
    _one_of("mlperf.status", cfg.mlperf.status, ("cloud", "onprem", "preview", "research"))
    if cfg.eval.target_auc is not None and not 0.5 <= cfg.eval.target_auc <= 1.0:
        raise ConfigError(f"eval.target_auc: {cfg.eval.target_auc} is outside [0.5, 1]")
