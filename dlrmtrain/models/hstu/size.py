"""DLRMv4 parameter count and per-sample FLOPs, from the config alone (nothing is
allocated: the full model's tables hold ~150 G parameters). The command that prints them
for a config is scripts/hstu_size.py.

FLOPs are given two ways, per sample at a full `max_seq_len` sequence:
- `reference`: the MLPerf reference's own yardstick (`DlrmHSTU.get_num_flops_per_sample`):
  the STU layers' three GEMM groups ×3 for forward + backward, the attention's two
  GEMMs ×3.5 and halved for causality, plus the one-task head's last layer;
- `full`: the same conventions over every matrix product of the model: also the
  preprocessor's per-row MLPs and contextual maps, the item MLP, postprocessor and
  prediction MLP (element-wise ops, norms and table lookups are not counted).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dlrmtrain.config.schema import Config
from dlrmtrain.models.hstu.head import head_params, item_mlp_params
from dlrmtrain.models.hstu.model import ACTION_BITS, HISTORY_ADDITIONAL, ITEM_FEATURES
from dlrmtrain.models.hstu.positional import positional_params
from dlrmtrain.models.hstu.postprocessor import TIME_PERIODS, postprocessor_params
from dlrmtrain.models.hstu.preprocessor import preprocessor_params
from dlrmtrain.models.hstu.stu import stu_layer_params
from dlrmtrain.models.hstu.tables import hstu_table_rows
from dlrmtrain.sequence_features import CONTEXTUAL_FEATURES

FLOPS_PER_MAC = 2
GEMM_TRAIN = 3.0
"""Forward + backward of a weight GEMM: forward, dX and dW."""
ATTENTION_TRAIN = 3.5
"""Forward + backward of the attention GEMMs (the reference's factor: backward ≈ 2.5× forward)."""


@dataclass
class ModelSize:
    dense_params: dict[str, int] = field(default_factory=dict)
    """Part of the model → its dense parameters."""
    table_params: dict[str, int] = field(default_factory=dict)
    """Table → rows × dim."""
    reference_train_flops: float = 0.0
    """Per sample, forward + backward, the reference's yardstick."""
    full_forward_flops: float = 0.0
    """Per sample, forward, every matrix product."""
    full_train_flops: float = 0.0
    """Per sample, forward + backward, every matrix product."""
    attention_forward_flops: float = 0.0
    """Per sample, forward, the attention GEMMs alone (causal half: part of full_forward_flops)."""

    @property
    def total_dense(self) -> int:
        return sum(self.dense_params.values())

    @property
    def total_tables(self) -> int:
        return sum(self.table_params.values())

    @property
    def total(self) -> int:
        return self.total_dense + self.total_tables


def model_size(cfg: Config) -> ModelSize:
    h, table_dim = cfg.model.hstu, cfg.model.embedding_dim
    d, heads, dqk, dv = h.dim, h.num_heads, h.attn_qk_dim, h.attn_linear_dim
    contextual, hidden = len(CONTEXTUAL_FEATURES), h.preprocessor_hidden_dim
    size = ModelSize()
    size.dense_params = {
        "preprocessor": preprocessor_params(table_dim, hidden, d, contextual,
                                            len(HISTORY_ADDITIONAL), len(ACTION_BITS),
                                            h.action_embedding_dim),
        "positional": positional_params(h.num_position_buckets, h.num_time_buckets, d),
        "stu": h.num_layers * stu_layer_params(d, heads, dqk, dv),
        "postprocessor": postprocessor_params(h.postprocessor, d),
        "item_mlp": item_mlp_params(table_dim, len(ITEM_FEATURES), h.item_mlp_hidden_dim, d),
        "head": head_params(d, h.head_hidden_dim),
    }
    size.table_params = {t: rows * table_dim
                         for t, rows in hstu_table_rows(cfg.model.max_table_rows).items()}

    s = float(h.max_seq_len)
    # Per STU layer: UVQK and output projections on every row; the two attention GEMMs
    # (q·kᵀ: dqk wide, scores·v: dv wide) over the causal half of the S × S scores.
    layer_gemm_macs = s * d * (2 * dv + 2 * dqk) * heads + s * 3 * heads * dv * d
    layer_attn_macs = s * s / 2 * heads * (dqk + dv)
    size.reference_train_flops = FLOPS_PER_MAC * (
        h.num_layers * (GEMM_TRAIN * layer_gemm_macs + ATTENTION_TRAIN * layer_attn_macs)
        + GEMM_TRAIN * d)  # the reference adds Linear(D, tasks) for its one task

    rows_per_sample = s - contextual  # history + candidate rows through the per-row MLPs
    action_in = len(ACTION_BITS) * h.action_embedding_dim
    per_row_mlps = sum(i * hidden + hidden * d
                       for i in (table_dim, table_dim * len(HISTORY_ADDITIONAL), action_in))
    candidate_macs = (table_dim * len(ITEM_FEATURES) * h.item_mlp_hidden_dim
                      + h.item_mlp_hidden_dim * d
                      + d * h.head_hidden_dim + h.head_hidden_dim
                      + ((d + 2 * len(TIME_PERIODS)) * d
                         if h.postprocessor == "timestamp_layer_norm" else 0))
    other_gemm_macs = rows_per_sample * per_row_mlps + contextual * table_dim * d + candidate_macs
    gemm_macs = h.num_layers * layer_gemm_macs + other_gemm_macs
    attn_macs = h.num_layers * layer_attn_macs
    size.attention_forward_flops = FLOPS_PER_MAC * attn_macs  # q·kᵀ and scores·v, causal half
    size.full_forward_flops = FLOPS_PER_MAC * gemm_macs + size.attention_forward_flops
    size.full_train_flops = FLOPS_PER_MAC * (GEMM_TRAIN * gemm_macs + ATTENTION_TRAIN * attn_macs)
    return size


def describe(cfg: Config, size: ModelSize) -> str:
    h = cfg.model.hstu
    lines = [f"DLRMv4 HSTU: {h.num_layers} STU layers, dim {h.dim}, {h.num_heads} heads "
             f"(qk {h.attn_qk_dim}, linear {h.attn_linear_dim}), tables dim "
             f"{cfg.model.embedding_dim}, max_seq_len {h.max_seq_len}",
             f"parameters: {size.total:,} = tables {size.total_tables:,} + dense {size.total_dense:,}"]
    lines += [f"  dense {name:14s} {n:>14,}" for name, n in size.dense_params.items()]
    lines += [f"  table {name:22s} {n:>16,}" for name, n in size.table_params.items()]
    lines += [f"FLOPs per sample at {h.max_seq_len} rows:",
              f"  reference yardstick (fwd+bwd): {size.reference_train_flops:>20,.0f}",
              f"  all matrix products (fwd):      {size.full_forward_flops:>20,.0f}",
              f"  all matrix products (fwd+bwd):  {size.full_train_flops:>20,.0f}"]
    return "\n".join(lines)
