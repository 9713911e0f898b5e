"""The run configuration as typed dataclasses, one per YAML section.

Every field carries a one-line docstring (the string under it). The YAML file
mirrors this tree exactly; unknown keys are errors (see loader.py). A field with
a fixed set of values is typed `Literal[...]`: the loader checks it from the type,
and the modules that act on the value read the allowed set from here
(`typing.get_args`). Cross-field checks are owned by the packages that know
the rules and run in order by `dlrmtrain.validation.validate_config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal, Optional, get_args, get_origin

from dlrmtrain.features import NUM_DENSE, NUM_SPARSE


@dataclass(frozen=True)
class Refused:
    """Annotated metadata: a value a Literal field refuses with a reason (the loader
    says why instead of only listing the allowed values)."""

    value: str
    reason: str


Device = Literal["auto", "cpu", "cuda"]
DataSource = Literal["synthetic", "criteo"]
DataFormat = Literal["auto", "dlrmtrain", "torchrec", "torchrec_multi_hot", "facebook_bin"]
SplitKind = Literal["mlperf", "names", "fraction"]
SyntheticProfile = Literal["custom", "kaggle", "terabyte"]
TerabyteTables = Literal["v1", "dcnv2"]
ModelArch = Literal["dlrm_v1", "dlrm_dcnv2"]
Planner = Literal["manual", "torchrec"]
ShardingType = Literal["table_wise", "column_wise", "row_wise", "data_parallel"]
OptimizerName = Literal["sgd", "adagrad"]
PrecisionMode = Annotated[Literal["fp32", "bf16"], Refused(
    "fp16", "it needs loss scaling, which TorchRec's in-backward embedding optimizers "
            "cannot honour; use bf16")]
Division = Literal["closed", "open"]
SubmissionStatus = Literal["cloud", "onprem", "preview", "research"]


def choices(choice_type: object) -> tuple[str, ...]:
    """The allowed values of one of the Literal types above (Annotated or not)."""
    if get_origin(choice_type) is Annotated:
        choice_type = get_args(choice_type)[0]
    if get_origin(choice_type) is not Literal:
        raise TypeError(f"{choice_type!r} is not a Literal type")
    return get_args(choice_type)


@dataclass
class RunConfig:
    name: str = "dlrm"
    """Run name; the run directory is `<output_dir>/<name>`."""
    output_dir: str = "runs"
    """Folder that holds one sub-folder per run (resolved config, metrics, summary)."""
    seed: int = 0
    """Seed for model initialisation and data order (same seed → same run)."""
    device: Device = "auto"
    """`auto` (GPU when present, else CPU), `cpu` or `cuda`."""
    global_batch_size: int = 2048
    """Samples per training step over all ranks; must divide by the world size."""
    epochs: float = 1.0
    """Passes over the training data (fractions allowed, e.g. 0.5)."""
    max_steps: Optional[int] = None
    """Stop after this many steps even if the epochs are not done (null: no cap)."""
    pipeline: bool = False
    """Overlap the next batch's sparse input all-to-all with this batch's compute
    (TorchRec TrainPipelineSparseDist); same numbers as the plain loop."""
    ddp_bucket_mb: int = 25
    """Size of the dense gradients' all-reduce buckets (DDP `bucket_cap_mb`; TorchRec's
    default 25). A bucket is reduced as soon as its gradients are ready, so smaller
    buckets start the all-reduce earlier in the backward pass."""
    overwrite: bool = False
    """A new run refuses a run directory (or checkpoint dir) that holds another run;
    true: delete that run's records and checkpoints first."""
    collective_timeout_s: float = 300.0
    """A collective that does not complete within this many seconds (e.g. a frozen
    rank) fails the job instead of waiting; keep it above the longest eval/checkpoint."""


@dataclass
class SyntheticDataConfig:
    num_train_samples: int = 262_144
    """Samples in the synthetic training set."""
    num_eval_samples: int = 32_768
    """Samples in the synthetic evaluation set (drawn from the same distribution)."""
    zipf_exponent: float = 1.1
    """Skew of categorical ids: P(id = k) ∝ 1 / (k + 1)^exponent."""
    teacher_seed: int = 1234
    """Seed of the hidden teacher that labels the samples (fixes the task)."""
    label_noise: float = 1.0
    """Scale of the logistic noise on the teacher's logit (higher: harder task)."""
    profile: SyntheticProfile = "custom"
    """`custom` (table_sizes, zipf_exponent), `kaggle` or `terabyte`: calibrated sizes and skew replace them."""
    terabyte_tables: TerabyteTables = "v1"
    """Profile `terabyte`: MLPerf `v1` or `dcnv2` table sizes."""
    scale: float = 1.0
    """Profile `terabyte`: multiply table sizes by this, in (0, 1]; tables under 100 rows stay whole."""


@dataclass
class DataConfig:
    source: DataSource = "synthetic"
    """Where samples come from: `synthetic` (generated on the fly) or `criteo` (files on disk, see path)."""
    table_sizes: Optional[list[int]] = None
    """Cardinality of each categorical column (ids are in [0, size)); one entry per table.
    null: a preprocessed dataset's own sizes (its dataset.json); synthetic data: the profile's,
    or 1000 rows per table for profile `custom`. Sizes given for a preprocessed dataset must
    equal the ones it records."""
    num_dense_features: int = NUM_DENSE
    """Dense (integer count) features per sample."""
    multi_hot_sizes: Optional[list[int]] = None
    """Fixed bag size per table for DCNv2 multi-hot data (null: one-hot, or the sizes the
    dataset's dataset.json records)."""
    synthetic: SyntheticDataConfig = field(default_factory=SyntheticDataConfig)
    """Settings of the synthetic generator (used when source is `synthetic`)."""
    path: Optional[str] = None
    """Source `criteo`: dataset directory (data_prep output, TorchRec day_*.npy/.npz, or terabyte_processed_*.bin)."""
    format: DataFormat = "auto"
    """Source `criteo`: `auto`, `dlrmtrain`, `torchrec`, `torchrec_multi_hot` or `facebook_bin`."""
    split: SplitKind = "mlperf"
    """Source `criteo`: `mlperf` (days 0-22 / first half of day 23), `names` or `fraction`."""
    train_parts: list[str] = field(default_factory=list)
    """Split `names`: parts (files, e.g. day_0) to train on."""
    eval_parts: list[str] = field(default_factory=list)
    """Split `names`: parts to evaluate on."""
    eval_fraction: float = 0.1
    """Split `fraction`: the last this fraction of all rows is the eval set."""
    shuffle_batches: bool = False
    """Source `criteo`: shuffle the order of global batches per epoch (rows within a batch keep file order)."""
    prefetch_batches: int = 2
    """Source `criteo`: batches read ahead on a background thread (0: none)."""
    multi_hot_cache_dir: Optional[str] = None
    """Source `criteo` with multi_hot_sizes on one-hot data: keep the MLPerf bag lookup tables here (null: RAM)."""
    verify: bool = True
    """Source `criteo`, project layout: check every part's sha256 when the dataset is opened
    (each rank checks every world-size-th part) and fail naming the part. Costs one read of the
    data: about 2-5 s per GB on one core, divided by the number of ranks; false skips it."""
    verify_max_gb: float = 8.0
    """Verify only datasets up to this size (GB); larger ones (e.g. Criteo Terabyte) are not
    checked unless this is raised."""


@dataclass
class ModelConfig:
    arch: ModelArch = "dlrm_v1"
    """`dlrm_v1` (dot interaction, MLPerf v0.7–v2.1) or `dlrm_dcnv2` (low-rank cross net, v3.0+)."""
    embedding_dim: int = 128
    """Width of every embedding row (and of the bottom MLP's output)."""
    bottom_mlp: list[int] = field(default_factory=lambda: [512, 256, 128])
    """Bottom (dense) MLP layer widths; the last must equal embedding_dim."""
    top_mlp: list[int] = field(default_factory=lambda: [1024, 1024, 512, 256, 1])
    """Top (over) MLP layer widths; the last must be 1 (the click logit)."""
    dcn_num_layers: int = 3
    """DCNv2 only: number of low-rank cross layers."""
    dcn_low_rank_dim: int = 512
    """DCNv2 only: rank of each cross layer's weight factorisation."""
    max_table_rows: Optional[int] = None
    """Cap each table at this many rows; larger vocabularies are folded by `id mod cap` (scaled-down runs)."""


@dataclass
class ShardingConfig:
    planner: Planner = "manual"
    """`manual`: the plan is built from the choices below, the same on every machine;
    `torchrec`: TorchRec's planner picks placements within those choices (no row-wise on CPU)."""
    default_type: ShardingType = "table_wise"
    """Sharding for tables not listed in `tables`: table_wise | column_wise | row_wise | data_parallel."""
    tables: dict[str, ShardingType] = field(default_factory=dict)
    """Per-table sharding type, e.g. {t_cat_0: row_wise}."""
    table_ranks: dict[str, int] = field(default_factory=dict)
    """Manual plan only: the rank that holds a table-wise table, e.g. {t_cat_0: 1} (others: balanced)."""


@dataclass
class CommConfig:
    codec: str = "none"
    """Codec on the embedding all-to-all for every table. Lossless: `none` (TorchRec's stock
    dist), `dedup` (only the distinct rows of each block cross the wire) or `auto` (per
    all-to-all and table, `none` or `dedup`, whichever measures the faster step over the first
    training steps; re-checked on drift; see dlrmtrain/comm/auto_policy.py). LOSSY baselines
    (training differs from `none`): TorchRec's quantized comms `fp16`, `bf16`, `int8`, `fp8`
    (GPU only; run-wide, no per-table overrides), and `dedup+fp16` / `dedup+bf16` (dedup,
    then each unique row rounded on the wire)."""
    table_codecs: dict[str, str] = field(default_factory=dict)
    """Per-table codec overrides, e.g. {t_cat_3: none}."""


@dataclass
class OptimConfig:
    name: OptimizerName = "sgd"
    """`sgd` (MLPerf DLRM v1) or `adagrad` (MLPerf DCNv2); used for dense and embedding parameters."""
    lr: float = 1.0
    """Peak learning rate."""
    warmup_steps: int = 0
    """Linear warmup from 0 to `lr` over this many steps (0: none)."""
    decay_start_step: int = 0
    """Step at which polynomial (power 2) decay starts (0 with decay_steps 0: no decay)."""
    decay_steps: int = 0
    """Length of the decay; the rate reaches `end_lr` at decay_start_step + decay_steps."""
    end_lr: float = 0.0
    """Learning rate at the end of the decay."""
    adagrad_eps: float = 1e-8
    """Adagrad epsilon (MLPerf DCNv2: 1e-8)."""


@dataclass
class PrecisionConfig:
    mode: PrecisionMode = "fp32"
    """`fp32`, or `bf16`: bf16 autocast for the dense part and a bf16 embedding all-to-all
    (tables and optimizer state stay fp32; see dlrmtrain/precision.py)."""


@dataclass
class EvalConfig:
    evals_per_epoch: int = 20
    """Evaluations per training epoch (MLPerf: 20); 0 evaluates only at the end."""
    batch_size: int = 16384
    """Global evaluation batch size (may exceed the training batch)."""
    target_auc: Optional[float] = None
    """Stop when an evaluation reaches this ROC AUC (null: train the full schedule)."""
    enabled: bool = True
    """False: throughput-only mode, no evaluation at all."""


@dataclass
class CheckpointConfig:
    every_steps: int = 0
    """Save a checkpoint every this many steps (0: only at the end, if `at_end`)."""
    at_end: bool = False
    """Also save when training ends."""
    dir: Optional[str] = None
    """Where checkpoints go (null: `<run dir>/checkpoints`)."""
    keep: int = 2
    """How many complete checkpoints to keep (older ones are deleted)."""
    resume: bool = False
    """Start from the latest complete, verified checkpoint in `dir` (if there is one)."""
    on_error: Literal["stop", "warn"] = "stop"
    """A save that fails (full disk, I/O error): `stop` the run with one clear error, or
    `warn` at every failed save and train on without that checkpoint."""


@dataclass
class LoggingConfig:
    progress_bar: bool = True
    """Show a tqdm bar with loss, lr and samples/s on rank 0."""
    metrics_every_steps: int = 50
    """Write a training-metrics line to metrics.jsonl every this many steps."""
    step_breakdown: bool = False
    """Time data / forward / backward / optimizer and the collectives over 10 steps
    (from step 3; adds GPU syncs) and print the split at the end."""


@dataclass
class MLPerfConfig:
    enabled: bool = False
    """Write MLPerf `:::MLLOG` events to `<run dir>/mlperf.log` (rank 0; benchmark from model.arch)."""
    org: str = "dlrmtrain"
    """submission_org."""
    division: Division = "closed"
    """submission_division: `closed` or `open`."""
    platform: str = "cpu"
    """submission_platform: the system, in words."""
    status: SubmissionStatus = "research"
    """submission_status: `cloud`, `onprem`, `preview` or `research`."""


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    """Run identity, seed, device, batch size and length."""
    data: DataConfig = field(default_factory=DataConfig)
    """Dataset schema and source."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Model architecture and sizes."""
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    """How embedding tables are spread over ranks."""
    comm: CommConfig = field(default_factory=CommConfig)
    """Compression of the embedding all-to-all."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and learning-rate schedule."""
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    """Numeric precision."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation cadence, size and stopping target."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Saving and resuming training state."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Console and run-directory output."""
    mlperf: MLPerfConfig = field(default_factory=MLPerfConfig)
    """MLPerf compliance logging."""
