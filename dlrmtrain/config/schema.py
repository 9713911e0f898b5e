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

from dlrmtrain.features import NUM_DENSE


@dataclass(frozen=True)
class Refused:
    """Annotated metadata: a value a Literal field refuses with a reason (the loader
    says why instead of only listing the allowed values)."""

    value: str
    reason: str


@dataclass(frozen=True)
class Alias:
    """Annotated metadata: a value a Literal field accepts as another of its values
    (an older spelling kept working), e.g. `true` for `sparse_dist`."""

    value: object
    means: str


Device = Literal["auto", "cpu", "cuda"]
DataSource = Literal["synthetic", "criteo", "synthetic_yambda", "yambda"]
YambdaHistoryStrategy = Literal["interleaved", "last_n"]
DataFormat = Literal["auto", "dlrmtrain", "torchrec", "torchrec_multi_hot", "facebook_bin"]
SplitKind = Literal["mlperf", "names", "fraction"]
SyntheticProfile = Literal["custom", "kaggle", "terabyte"]
TerabyteTables = Literal["v1", "dcnv2"]
ModelArch = Literal["dlrm_v1", "dlrm_dcnv2", "dlrmv4_hstu"]
HSTUPostprocessor = Literal["timestamp_layer_norm", "layer_norm", "l2_norm"]
HSTUAttention = Literal["auto", "padded", "blocked", "triton"]
"""`model.hstu.attention`: the STU layers' attention kernel (models/hstu/attention/kinds.py maps
each name to its kernel and resolves `auto`)"""
Planner = Literal["manual", "torchrec"]
ShardingType = Literal["table_wise", "column_wise", "row_wise", "data_parallel"]
OptimizerName = Literal["sgd", "adagrad", "adam"]
HierarchyKind = Literal["flat", "node"]
"""`comm.hierarchy`; with `comm.ranks_per_node` it becomes comm/topology.py's `Hierarchy`, the one form
the codecs, their dists and their counters get"""
CodecName = Literal["none", "dedup", "auto", "fp16", "bf16", "int8", "fp8", "dedup+fp16", "dedup+bf16"]
"""`comm.codec` / `comm.table_codecs` names (comm/declarations.py checks BUILT_IN declares exactly these)"""
DedupAt = Literal["owner", "source"]
"""`comm.dedup_at`: where lossless `dedup` finds the distinct bags (comm/placement_choice.py's
`check` refuses `source` where it is not built; unset: resolved by its `resolve`, called by
validation.resolve_config)"""
PrecisionMode = Annotated[Literal["fp32", "bf16"], Refused(
    "fp16", "it needs loss scaling, which TorchRec's in-backward embedding optimizers "
            "cannot honour; use bf16")]
PipelineMode = Annotated[
    Literal["off", "sparse_dist", "fused_sparse_dist", "auto"],
    Alias(False, "off"), Alias(True, "sparse_dist"),
    Refused("semi_sync", "TorchRec's TrainPipelineSemiSync looks batch i+1's embeddings up "
                         "before batch i's embedding update (one step stale): not the math of "
                         "the plain loop, which every run.pipeline choice keeps (nor does it "
                         "run without CUDA streams); use fused_sparse_dist")]
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
    pipeline: PipelineMode = "auto"
    """Overlap across steps, same numbers as the plain loop: `auto` (`sparse_dist` on CUDA,
    `off` on CPU; Workload.default_pipeline); `off`; `sparse_dist`
    (`true`): the next batch's id all-to-all runs during this step (TorchRec
    TrainPipelineSparseDist); `fused_sparse_dist`: that, and this batch's lookup and
    embedding all-to-all start before its step, in flight during the data loading and
    input dist of the batches after it (TorchRec TrainPipelineFusedSparseDist; CPU only)."""
    ddp_bucket_mb: float = 25
    """Size of the dense gradients' all-reduce buckets (DDP `bucket_cap_mb`; TorchRec's
    default 25). A bucket is reduced as soon as its gradients are ready, so smaller
    buckets start the all-reduce earlier in the backward pass; fractions serve a dense
    part smaller than a megabyte (the mini DLRMv4's 0.5 MB)."""
    overwrite: bool = False
    """A new run refuses a run directory (or checkpoint dir) that holds another run;
    true: delete that run's records and checkpoints first. Refused together with
    checkpoint.resume=true (which keeps them)."""
    collective_timeout_s: float = 300.0
    """A collective that does not complete within this many seconds (e.g. a frozen
    rank) fails the job instead of waiting; keep it above the longest eval/checkpoint."""
    stall_warn_s: float = 30.0
    """A rank whose heartbeat (written every few seconds by a thread, through the job's
    store) is silent this long is named in a warning while the silence lasts, and its
    stalled seconds are kept out of the throughput; 0: no heartbeat. 30 s: a tenth of the
    default collective timeout, so a frozen rank is named minutes before the timeout ends
    the job, yet six heartbeats long, so a rank slowed by a busy machine is not named."""


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
class SyntheticYambdaConfig:
    """Source `synthetic_yambda`: a Yambda-like generator (dlrmtrain/data/yambda/synthetic.py).
    The defaults are its calibration to the reference's in-batch unique rates (2.4 % item,
    1.5 % album, 0.6 % artist at per-rank batch 1024, 2627 history events per sample)."""

    seed: int = 0
    """Seed of the generated data (fixed across run seeds, so every seed trains the same task)."""
    num_users: int = 8192
    """Users; each contributes anchors_per_user train and eval_anchors_per_user eval samples."""
    anchors_per_user: int = 8
    """Consecutive train samples per user (user-major order, as the reference streams)."""
    eval_anchors_per_user: int = 2
    """Eval samples per user: the anchors right after its train ones."""
    history_length: int = 2627
    """Longest history (events) of a sample."""
    min_history_fraction: float = 1.0
    """A user's history length is uniform in [this * history_length, history_length]."""
    num_artists: int = 391_000
    """Catalog size; items = num_artists * albums_per_artist * tracks_per_album."""
    albums_per_artist: int = 6
    """Albums of every artist in the catalog."""
    tracks_per_album: int = 4
    """Tracks of every album in the catalog."""
    artist_zipf: float = 1.0
    """Skew of artists' global popularity."""
    artists_per_user: float = 331.4
    """Mean favourite artists per user (sets the artist unique rate)."""
    user_zipf: float = 0.8
    """Skew of a user's listens over its favourite artists."""
    album_zipf: float = 2.227
    """Skew over an artist's albums (sets the album unique rate)."""
    track_zipf: float = 2.296
    """Skew over an album's tracks (sets the item unique rate)."""
    calibrate: bool = False
    """Re-fit artists_per_user / album_zipf / track_zipf to the reference's unique rates at this
    run's per-rank batch and history length before generating (a few seconds per rank)."""


@dataclass
class YambdaDataConfig:
    """Sources `yambda` and `synthetic_yambda` (DLRMv4): the reference's sample settings."""

    path: Optional[str] = None
    """Source `yambda`: the prepared dataset (`dlrmtrain preprocess-yambda`)."""
    history_length: int = 4086
    """History cap: per pool 3 x (history_length // 3) for `interleaved`, total for `last_n`."""
    history_strategy: YambdaHistoryStrategy = "interleaved"
    """`interleaved` (last history_length // 3 of each pool, merged in time order) or `last_n`."""
    scan_window: int = 20_000
    """Events before an anchor that its history is chosen from."""
    min_history: int = 4086
    """Earlier events a LISTEN needs to be an anchor (sample)."""
    max_seq_len: int = 4096
    """Model sequence budget: a history is cut to max_seq_len - 9 (1 candidate, 8 contextual)."""
    window_seconds: int = 86_400
    """Streaming window (the reference trains window T, evaluates a later one)."""
    start_window: int = 0
    """First training window."""
    num_train_windows: int = 299
    """Training windows (clamped to the data's)."""
    eval_window: int = 299
    """First eval window (the reference's eval_holdout_ts)."""
    eval_num_windows: int = 1
    """Eval windows from eval_window."""
    shuffle_fraction: float = 0.0
    """In-window shuffle in [0, 1] (0: user-major order, the reference default)."""
    shuffle_seed: int = 0
    """Seed of that shuffle."""
    train_fraction: float = 1.0
    """Share of users trained (by uid hash); the others are only evaluated. 1.0: no holdout."""
    split_salt: int = 0
    """Salt of the user hash of train_fraction."""
    cross_rows: dict[str, int] = field(default_factory=dict)
    """Rows of the hashed cross tables by name (e.g. user_x_artist); unlisted: the reference's."""
    prefetch_batches: int = 2
    """Batches built ahead on a background thread (0: none)."""
    synthetic: SyntheticYambdaConfig = field(default_factory=SyntheticYambdaConfig)
    """Source `synthetic_yambda`: the generator."""


@dataclass
class DataConfig:
    source: DataSource = "synthetic"
    """Where samples come from: `synthetic` (generated on the fly) or `criteo` (files on disk, see path);
    for model.arch dlrmv4_hstu `synthetic_yambda` or `yambda` (sequences, see data.yambda)."""
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
    yambda: YambdaDataConfig = field(default_factory=YambdaDataConfig)
    """Sources `yambda` / `synthetic_yambda` (DLRMv4 sequences)."""
    workers: Optional[int] = None
    """Threads per rank making the batches read ahead (sources `criteo`, `yambda`,
    `synthetic_yambda`, with their prefetch_batches > 0): each makes whole batches with their
    source transform (comm.dedup_at: source); the step gets them in order, the same batches
    for any count. null: half this rank's share of the machine's cores, at least 1, at most 4."""


@dataclass
class HSTUConfig:
    """The DLRMv4 HSTU model (MLPerf reference defaults for yambda-5b)."""

    max_seq_len: int = 4096
    """Longest sequence the model accepts: contextual tokens + history + candidates."""
    dim: int = 512
    """Width of the sequence the STU layers transform (reference hstu_transducer_embedding_dim)."""
    num_layers: int = 3
    """STU layers (reference hstu_attn_num_layers; its yambda gin sets 3)."""
    num_heads: int = 4
    """Attention heads per STU layer."""
    attn_qk_dim: int = 128
    """Query/key width per head; attention logits are scaled by 1/sqrt of it."""
    attn_linear_dim: int = 128
    """Value/gate (u, v) width per head."""
    preprocessor_hidden_dim: int = 256
    """Hidden width of the preprocessor's content, additional and action MLPs."""
    item_mlp_hidden_dim: int = 512
    """Hidden width of the candidate item MLP."""
    head_hidden_dim: int = 512
    """Hidden width of the prediction MLP on user ⊙ item."""
    action_embedding_dim: int = 8
    """Width of each action bit's embedding (listen_plus, like, skip)."""
    action_embedding_init_std: float = 0.1
    """Std of the action embeddings' normal init."""
    input_dropout: float = 0.2
    """Dropout on the encoded sequence before the first STU layer."""
    linear_dropout: float = 0.1
    """Dropout inside each STU layer, before its output projection."""
    num_position_buckets: int = 8192
    """Rows of the position-embedding table (positions past it share the last row)."""
    num_time_buckets: int = 2048
    """Time buckets, floor(sqrt(seconds before the candidate / 60)), capped at this."""
    postprocessor: HSTUPostprocessor = "timestamp_layer_norm"
    """Last step of the user embedding: `timestamp_layer_norm` (reference yambda), `layer_norm`, `l2_norm`."""
    loss_weight: float = 0.2
    """The listen_plus BCE is multiplied by this (reference causal_multitask_weights)."""
    attention: HSTUAttention = "auto"
    """The attention kernel, one function of the same numbers (up to fp32 summation order):
    `padded` ([B, H, N, N] scores kept for the backward: the parity reference), `blocked`
    (jagged square tiles in PyTorch, scores recomputed in the backward; any device), `triton`
    (jagged Triton kernels; CUDA, or CPU under TRITON_INTERPRET=1) or `auto` (triton on CUDA;
    on CPU padded up to 128-row sequences, blocked above)."""


@dataclass
class ModelConfig:
    arch: ModelArch = "dlrm_v1"
    """`dlrm_v1` (dot interaction, MLPerf v0.7–v2.1), `dlrm_dcnv2` (low-rank cross net, v3.0+)
    or `dlrmv4_hstu` (HSTU generative recommender on Yambda, v6.1+; see `hstu`)."""
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
    hstu: HSTUConfig = field(default_factory=HSTUConfig)
    """`dlrmv4_hstu` only: the HSTU dimensions (bottom_mlp, top_mlp and dcn_* do not apply)."""


@dataclass
class UvmCachingConfig:
    """Tables kept in host memory (UVM) behind an HBM cache of their most used rows: TorchRec's
    `fused_uvm_caching` kernel, for tables the GPUs cannot hold (`dlrmtrain plan` shows what it
    frees). CUDA only: fbgemm's CPU build has no UVM kernel, so a CPU run refuses it."""

    tables: list[str] = field(default_factory=list)
    """Tables cached by name, e.g. [user_x_artist]."""
    min_rows: Optional[int] = None
    """Also every table of at least this many rows (null: by name only)."""
    load_factor: float = 0.2
    """Share of a cached table's rows its HBM cache holds (TorchRec's cache_load_factor), in (0, 1]."""


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
    uvm_caching: UvmCachingConfig = field(default_factory=UvmCachingConfig)
    """Tables looked up from host memory through an HBM cache (`fused_uvm_caching`, CUDA only)."""


@dataclass
class AutoConfig:
    """`comm.codec: auto`'s settings (dlrmtrain/comm/auto/policy.py documents its phases; its
    `AutoPolicy` is these settings plus its state, so the defaults are declared here only)."""

    warmup_steps: int = 1
    """Untimed steps before the first probe (the first steps pay one-off costs; at least 1)."""
    probe_steps: int = 6
    """Timed steps per path in one probe (at least 1)."""
    min_probe_steps: int = 2
    """Timed steps per path before a clear-cut probe may end early (1 to probe_steps)."""
    clear_margin: float = 0.10
    """Early end: the slowest step of one path beats the fastest of the other by this much."""
    margin: float = 0.03
    """The other path must be this much faster (relative, below 1) to switch."""
    check_every: int = 50
    """Steady steps between drift checks (at least 1)."""
    min_dwell: int = 200
    """Steps a decision stands before drift may reopen it."""
    drift: float = 0.25
    """Relative move of the step time or distinct fraction that starts a new probe (above 0)."""
    drift_samples: int = 8
    """Recent step times a drift check needs (timed steps before each check point; at least 1)."""
    close_call_retimes: int = 2
    """A close call (a measured gap within `margin`, or within the probe's own spread of step
    times, or against what the bytes say) stays open: the cheaper-looking path runs and both are
    timed again at the next check point, each time adding `retime_steps` more steps of each path
    to the call's evidence, at most this many times
    (0: settled at once, as the cheaper-looking path; negative refused)."""
    retime_steps: int = 3
    """Timed steps of each path one re-timing of a close call adds to its evidence (at least 1):
    its cost on the slower path. 3: two re-timings cost 6 steps, ~2.5% of a 256-step run, and
    the decision rests on 9, then 12 steps a path."""
    table_keep_fraction: float = 0.9
    """A table whose distinct fraction is at least this keeps the stock path (dedup saves
    little); in (0, 1]. Owner-side auto on pooled embeddings only (the per-table choice):
    refused under comm.dedup_at: source and on sequence embeddings."""


@dataclass
class CommConfig:
    codec: CodecName = "none"
    """Codec on the embedding all-to-all for every table. Lossless: `none` (TorchRec's stock
    dist), `dedup` (only the distinct rows of each block cross the wire) or `auto` (per
    all-to-all and table, `none` or `dedup`, whichever measures the faster step over the first
    training steps; re-checked on drift; see dlrmtrain/comm/auto/policy.py). LOSSY baselines
    (training differs from `none`): TorchRec's quantized comms `fp16`, `bf16`, `int8`, `fp8`
    (GPU only; run-wide, no per-table overrides), and `dedup+fp16` / `dedup+bf16` (dedup,
    then each unique row rounded on the wire)."""
    table_codecs: dict[str, CodecName] = field(default_factory=dict)
    """Per-table codec overrides, e.g. {t_cat_3: none}."""
    hierarchy: HierarchyKind = "flat"
    """`flat`: one all-to-all over all ranks. `node` (codec `dedup`, or `auto`): two levels,
    lossless: per (table, destination node) only the node's distinct rows cross between
    nodes, each rank talking only to its peer of every other node, then they reach each
    rank inside the node. One node: the same as `flat`."""
    ranks_per_node: Optional[int] = None
    """Ranks per node for `hierarchy: node` and the between-node byte counts; null: torchrun's
    LOCAL_WORLD_SIZE. Set it to simulate nodes on one machine (e.g. 2 with 4 ranks: 2 nodes)."""
    dedup_at: Optional[DedupAt] = None
    """Where lossless dedup finds the distinct rows. `owner`: at the owner (every id still crosses
    the id all-to-all and is looked up). `source`: each feature's ids are made distinct where the
    batch is made, so only they cross and are looked up (TorchRec's own paths: pooled tables'
    variable batch, the sequence loader's distinct ids per table; `dedup` and `auto`). Unset
    (null): resolved when the run starts (validation.resolve_config; the run folder's config
    records the value taken) to `source` where the run's codec dedups and its path carries it,
    else `owner`, printing why: pooled `optim.name: adagrad`, the lossy `dedup+fp16/bf16`,
    `comm.hierarchy: node`, a per-table codec the source does not carry, and pooled plans whose tables are mostly row-wise (there source's output sends world size x
    the distinct rows). An explicit value is kept; an explicit `source` where it is not built is
    refused."""
    auto: AutoConfig = field(default_factory=AutoConfig)
    """`codec: auto`'s probe, hysteresis and drift settings, e.g. comm.auto.probe_steps=4 (every
    all-to-all's policy and the source's take them); refused unless a codec of the run is `auto`."""


@dataclass
class OptimConfig:
    name: OptimizerName = "sgd"
    """`sgd` (MLPerf DLRM v1) or `adagrad` (MLPerf DCNv2): the same rule for dense and embedding
    parameters; `adam` (MLPerf DLRMv4): Adam on the dense parameters (adam_betas, adam_eps, no
    weight decay) and fused RowWiseAdagrad (adagrad_eps) on the sharded tables, as the reference."""
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
    """Adagrad epsilon (MLPerf DCNv2: 1e-8); with `adam`, the tables' RowWiseAdagrad epsilon."""
    adam_betas: list[float] = field(default_factory=lambda: [0.95, 0.999])
    """`adam`: the two moment decay rates, each in [0, 1) (MLPerf DLRMv4 reference: 0.95, 0.999)."""
    adam_eps: float = 1e-8
    """`adam`: the dense Adam's epsilon (reference: 1e-8)."""
    grad_clip_norm: Optional[float] = None
    """Clip the dense parameters' gradients (after the all-reduce) to this total L2 norm
    before each dense step (MLPerf DLRMv4: 1.0); null: no clipping. The tables' fused
    update inside the backward pass is never clipped, as in the reference."""


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
    eval_every_data_pct: float = 0.001
    """dlrmv4: evaluate every this fraction of the train samples, on the closed rules' grid
    of global steps (rules: 0.001; small runs use a coarser one under derived rules)."""
    skip_eval_epoch_pct: Optional[float] = None
    """dlrmv4: no eval before this fraction of the train samples (the reference's knob);
    null: the closed rules' first eval for the global batch (block 25 at 8192)."""


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
