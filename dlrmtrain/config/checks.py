"""The config's own cross-field rules: sizes, ranges and table names.

Rules that need another package's knowledge (the data's shape, the sharding
planner's limits, the codec registry) live in that package; `dlrmtrain.validation`
runs them all in order. Allowed values of choice fields are Literal types that the
loader checks (schema.py).
"""

from __future__ import annotations

import os

from dlrmtrain.config.loader import ConfigError
from dlrmtrain.config.schema import Config, HSTUAttention, choices


def check_run(cfg: Config, world_size: int) -> None:
    run = cfg.run
    if run.name in ("", ".", "..") or any(c in run.name for c in "/\\\0"):
        raise ConfigError(f"run.name: {run.name!r} must name one folder inside run.output_dir "
                          f"(not empty, '.' or '..', no '/'); put a path in run.output_dir")
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
    if run.collective_timeout_s <= 0:
        raise ConfigError(f"run.collective_timeout_s: must be positive, got {run.collective_timeout_s}")
    if run.stall_warn_s < 0:
        raise ConfigError(f"run.stall_warn_s: must be positive, or 0 for no heartbeat; got "
                          f"{run.stall_warn_s}")
    if run.ddp_bucket_mb <= 0:
        raise ConfigError(f"run.ddp_bucket_mb: must be positive, got {run.ddp_bucket_mb}")
    if run.overwrite and cfg.checkpoint.resume:  # one would undo the other: neither is dropped
        raise ConfigError("checkpoint.resume=true and run.overwrite=true: a resume continues "
                          "the run's records, an overwrite deletes them first; give one of them")


def check_model(cfg: Config) -> None:
    """model: what every family shares (each family's own: its workload, dlrmtrain/workloads/)."""
    model = cfg.model
    if model.max_table_rows is not None and model.max_table_rows < 1:
        raise ConfigError("model.max_table_rows: must be positive or null")


def check_dlrm_model(cfg: Config) -> None:
    """model (the DLRM models' section): the MLPs end in the embedding width and the logit."""
    model = cfg.model
    if model.bottom_mlp[-1:] != [model.embedding_dim]:
        raise ConfigError(f"model.bottom_mlp: the last width must equal model.embedding_dim "
                          f"({model.embedding_dim}), got {model.bottom_mlp}")
    if model.top_mlp[-1:] != [1]:
        raise ConfigError(f"model.top_mlp: the last width must be 1 (the logit), got {model.top_mlp}")


def _value(cfg: Config, dotted: str):
    for name in dotted.split("."):
        cfg = getattr(cfg, name)
    return cfg


def check_unused_keys(cfg: Config, arch: str, keys: tuple[str, ...],
                      settings_of: dict[str, str]) -> None:
    """Refuse `keys` (a family's Workload.unused_keys) set to anything but their default,
    rather than drop them; `settings_of`: section → where that family's own settings are."""
    default = Config()
    for key in keys:
        if _value(cfg, key) != _value(default, key):
            where = settings_of[key.split(".", 1)[0]]
            raise ConfigError(f"{key}: does not apply to model.arch {arch} (its settings are "
                              f"under {where}); remove it")


def check_hstu_model(cfg: Config) -> None:
    """model.hstu (the HSTU model's section): sizes, rates, and room for a history in
    max_seq_len."""
    h = cfg.model.hstu
    if cfg.model.embedding_dim < 1:
        raise ConfigError(f"model.embedding_dim: must be positive, got {cfg.model.embedding_dim}")
    for key in ("dim", "num_layers", "num_heads", "attn_qk_dim", "attn_linear_dim",
                "preprocessor_hidden_dim", "item_mlp_hidden_dim", "head_hidden_dim",
                "action_embedding_dim", "num_position_buckets", "num_time_buckets"):
        if getattr(h, key) < 1:
            raise ConfigError(f"model.hstu.{key}: must be positive, got {getattr(h, key)}")
    for key in ("input_dropout", "linear_dropout"):
        if not 0.0 <= getattr(h, key) < 1.0:
            raise ConfigError(f"model.hstu.{key}: must be in [0, 1), got {getattr(h, key)}")
    for key in ("loss_weight", "action_embedding_init_std"):
        if getattr(h, key) <= 0:
            raise ConfigError(f"model.hstu.{key}: must be positive, got {getattr(h, key)}")
    # imported here: the sequence layout brings torch, which DLRM configs never need
    from dlrmtrain.sequence_features import CONTEXTUAL_FEATURES

    least = len(CONTEXTUAL_FEATURES) + 2  # contextual tokens, one history event, the candidate
    if h.max_seq_len < least:
        raise ConfigError(f"model.hstu.max_seq_len: {h.max_seq_len} leaves no room for a history "
                          f"(the {len(CONTEXTUAL_FEATURES)} contextual tokens and the candidate "
                          f"take {least - 1}); at least {least}")


def check_hstu_attention(cfg: Config, device_type: str) -> None:
    """model.hstu.attention: a kernel's name, one that runs on `device_type` (triton: CUDA, or
    CPU under Triton's interpreter, which a process must have set before Triton is imported)."""
    kind = cfg.model.hstu.attention
    if kind not in choices(HSTUAttention):
        raise ConfigError(f"model.hstu.attention: {kind!r} is not one of {', '.join(choices(HSTUAttention))}")
    if kind == "triton" and device_type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ConfigError(f"model.hstu.attention: triton runs on CUDA, not on this {device_type} run (on CPU "
                          f"only under Triton's interpreter, for tests, slow: set TRITON_INTERPRET=1 before "
                          f"the run starts); use blocked or auto")


def check_table_keys(cfg: Config, names: list[str]) -> None:
    """Every per-table setting names one of the model's tables, `names` (its workload's)."""
    known = set(names)
    for table in cfg.sharding.table_ranks:
        if table not in known:
            raise ConfigError(f"sharding.table_ranks.{table}: no such table")
    for table in cfg.sharding.tables:
        if table not in known:
            raise ConfigError(f"sharding.tables.{table}: no such table (tables are {names[0]} … "
                              f"{names[-1]})")
    for table in cfg.comm.table_codecs:
        if table not in known:
            raise ConfigError(f"comm.table_codecs.{table}: no such table")
    for table in cfg.sharding.uvm_caching.tables:
        if table not in known:
            raise ConfigError(f"sharding.uvm_caching.tables: {table!r}: no such table")


def check_comm_auto(cfg: Config, collection_kind: str = "pooled") -> None:
    """comm.auto: set only where a codec of the run is `auto` (else nothing would read it), and
    values its policy can run (comm/auto/policy.py). `collection_kind`: the workload's."""
    comm, default = cfg.comm, Config().comm.auto
    if "auto" not in (comm.codec, *comm.table_codecs.values()):
        changed = [f"comm.auto.{k}" for k, v in vars(comm.auto).items() if v != getattr(default, k)]
        if changed:
            raise ConfigError(f"{changed[0]}: set, but no codec of this run is auto (comm.codec: "
                              f"{comm.codec}); remove it, or use comm.codec: auto")
    a = comm.auto
    # warmup_steps too: the policy starts in warmup, so 0 would run as 1
    for key in ("warmup_steps", "probe_steps", "min_probe_steps", "check_every", "drift_samples", "retime_steps"):
        if getattr(a, key) < 1:
            raise ConfigError(f"comm.auto.{key}: must be at least 1, got {getattr(a, key)}")
    if a.min_probe_steps > a.probe_steps:
        raise ConfigError(f"comm.auto.min_probe_steps: {a.min_probe_steps} exceeds comm.auto.probe_steps "
                          f"{a.probe_steps} (a probe ends after probe_steps per path)")
    if a.margin >= 1:  # a path can never be 100% faster: auto would keep none for good
        raise ConfigError(f"comm.auto.margin: must be below 1 (a relative gain), got {a.margin}; "
                          f"to keep none, use comm.codec: none")
    if a.drift <= 0:  # 0: every check would re-probe
        raise ConfigError(f"comm.auto.drift: must be positive, got {a.drift}")
    if not 0 < a.table_keep_fraction <= 1:
        raise ConfigError(f"comm.auto.table_keep_fraction: a distinct fraction in (0, 1], got "
                          f"{a.table_keep_fraction}")
    # per-table choices: only the owner's pooled auto dists make them (comm/auto/dist.py)
    no_table_choice = ("comm.dedup_at: source" if comm.dedup_at == "source"
                       else "sequence embeddings" if collection_kind == "sequence" else None)
    if no_table_choice and comm.auto.table_keep_fraction != default.table_keep_fraction:
        hint = ", or use comm.dedup_at: owner" if comm.dedup_at == "source" and collection_kind == "pooled" else ""
        raise ConfigError(f"comm.auto.table_keep_fraction: set, but auto makes no per-table choice "
                          f"under {no_table_choice} (only owner-side auto on pooled embeddings does); "
                          f"remove it{hint}")


def check_optim(cfg: Config) -> None:
    """optim: the rate, the schedule's steps and each optimizer's constants."""
    o = cfg.optim
    if o.lr <= 0:
        raise ConfigError(f"optim.lr: must be positive, got {o.lr}")
    for key in ("warmup_steps", "decay_start_step", "decay_steps"):
        if getattr(o, key) < 0:
            raise ConfigError(f"optim.{key}: must not be negative")
    for key in ("adagrad_eps", "adam_eps"):
        if getattr(o, key) <= 0:
            raise ConfigError(f"optim.{key}: must be positive, got {getattr(o, key)}")
    if len(o.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in o.adam_betas):
        raise ConfigError(f"optim.adam_betas: two decay rates in [0, 1), got {o.adam_betas}")
    if o.grad_clip_norm is not None and o.grad_clip_norm <= 0:
        raise ConfigError(f"optim.grad_clip_norm: must be positive or null, got {o.grad_clip_norm}")


def check_schedule_and_outputs(cfg: Config) -> None:
    check_optim(cfg)
    if cfg.checkpoint.every_steps < 0:
        raise ConfigError("checkpoint.every_steps: must not be negative")
    if cfg.checkpoint.keep < 1:
        raise ConfigError("checkpoint.keep: keep at least one checkpoint")
    if cfg.eval.evals_per_epoch < 0:
        raise ConfigError("eval.evals_per_epoch: must not be negative")
    if cfg.eval.target_auc is not None and not 0.5 <= cfg.eval.target_auc <= 1.0:
        raise ConfigError(f"eval.target_auc: {cfg.eval.target_auc} is outside [0.5, 1]")
