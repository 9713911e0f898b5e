"""DLRMv4's activations on one rank (models/activation_memory.py), by formula: per STU
layer its projections and norms and its attention (per kernel kind), the preprocessor with
the looked-up rows it reads, the candidate's towers, and under bf16 the weight copies
autocast keeps for the backward.

Sized at full fill: every sample `rows` long (the longest sequence the data yields), so
local batch × rows tokens, the worst batch a run can meet. Each term is a tensor autograd
keeps, named after the code that makes it (stu.py, attention/, preprocessor.py,
layers.py); `a` is the bytes of what runs under autocast (bf16 or fp32: the user tower,
precision.py), 4 what the code computes in fp32 whatever the mode (the layer norms'
inputs, the gate's operands). tests/models/test_activation_memory.py holds the STU layer
and the whole model to the bytes torch.autograd.graph.saved_tensors_hooks sees.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

from dlrmtrain.config.schema import Config, HSTUConfig
from dlrmtrain.models.activation_memory import (
    BF16, FP32, INT64, ActivationMemory, ActivationPart, activation_bytes)
from dlrmtrain.models.hstu.attention.blocked import chunk_scratch_bytes
from dlrmtrain.models.hstu.attention.kinds import KINDS, resolve


def attention_kind(hstu: HSTUConfig, device_type: str) -> str:
    """The attention kernel a run on `device_type` uses: model.hstu.attention, `auto` resolved
    by the rule the model itself follows when it is built (attention/kinds.py)."""
    return resolve(hstu.attention, device_type, hstu.max_seq_len)


def with_attention(cfg: Config, kind: str) -> Config:
    """A copy of `cfg` whose model.hstu.attention is `kind` (`dlrmtrain plan`'s lighter setting)."""
    lighter = copy.deepcopy(cfg)
    lighter.model.hstu.attention = kind
    return lighter


def _no_scratch(heads: int, rows: int, dim_qk: int, dim_v: int) -> int:
    return 0


@dataclass(frozen=True)
class JaggedAttentionCost:
    """What a jagged kernel keeps beyond the STU layer's own projection, and its scratch."""

    qkv_copies: int
    """Copies of q, k and v (H·(2·qk + linear) values per token) it saves for the backward
    (0 where it saves the views of the projection's output it was given)."""
    output_copies: int
    """Copies of its [tokens, H·linear] output it saves."""
    scratch: Callable[[int, int, int, int], int]
    """Its scratch in bytes at (heads, padded length, qk width, linear width), the same at any
    batch: one chunk of scores and operands (blocked), none outside the GPU's tiles (triton)."""


JAGGED_ATTENTION_COSTS = {
    # attention/blocked.py's save_for_backward: the q, k, v it was given (stu.py's views of
    # uvqk, which SiLU(u) keeps anyway) and its [pairs, 5] int64 table; one chunk at a time
    "blocked": JaggedAttentionCost(qkv_copies=0, output_copies=0, scratch=chunk_scratch_bytes),
    # attention/triton_kernels.py saves q, k, v made contiguous (copies of the views) and the
    # [B] offsets and targets; its tiles live in registers and shared memory
    "triton": JaggedAttentionCost(qkv_copies=1, output_copies=0, scratch=_no_scratch),
}

PADDED_INDEX_TENSORS = 8
"""int64 per token the padded kernel's jagged ↔ padded copies keep (jagged.to_padded's
(sample, position) for q, k and v, and to_jagged's)."""
POSITIONAL_INDEX_TENSORS = 6
"""int64 per token the positional encoder keeps (its bucket and gather indices)."""


def stu_projection_part(h: HSTUConfig, tokens: int, a: int) -> ActivationPart:
    """One STU layer's saved tensors outside the attention (stu.py's forward, in order)."""
    d, hv, width = h.dim, h.num_heads * h.attn_linear_dim, h.num_heads * (2 * h.attn_linear_dim + 2 * h.attn_qk_dim)
    per_token = (FP32 * d + 2 * FP32         # the input norm: its fp32 input, mean and rstd
                 + a * d                     # normed: the uvqk addmm's input
                 + a * width                 # uvqk: SiLU(u) keeps its input, a view of all of uvqk
                 + 3 * FP32 * hv + 2 * FP32  # u32, attn32 and the output norm's output, its mean and rstd
                 + (FP32 * 3 * hv if h.linear_dropout > 0 else 0)  # the dropout's mask
                 + a * 3 * hv)               # y: the output addmm's input
    # in the backward, about one layer's widest gradients at once: the fp32 concat's, uvqk's, x's
    scratch = FP32 * 3 * hv + a * width + FP32 * d
    return ActivationPart("the rest of each STU layer", saved=per_token * tokens, transient=scratch * tokens,
                          holds="projections, norms and gate: the fp32 norm inputs, uvqk, the gate's operands",
                          advice="use a smaller run.global_batch_size")


def attention_part(h: HSTUConfig, batch: int, rows: int, a: int, kind: str) -> ActivationPart:
    """One STU layer's attention under kernel `kind`, at `batch` samples of `rows` rows."""
    tokens, heads, qkv = batch * rows, h.num_heads, 2 * h.attn_qk_dim + h.attn_linear_dim
    if kind == "padded":  # attention/padded.py: [B, H, N, N] scores, autograd keeps them
        scores = batch * heads * rows * rows
        saved = (a * tokens * heads * qkv      # the padded q, k, v the two matmuls keep
                 + 2 * a * scores              # SiLU's input and the masked scores
                 + a * batch * rows * rows     # the mask, in the scores' dtype
                 + INT64 * PADDED_INDEX_TENSORS * tokens)
        return ActivationPart("the attention (padded)", saved=saved, transient=a * scores,
                              holds="[B, H, N, N] scores twice and the [B, N, N] mask per layer",
                              advice="use model.hstu.attention=blocked (CPU) or triton (GPU), "
                                     "or a smaller run.global_batch_size")
    if kind not in JAGGED_ATTENTION_COSTS:
        raise ValueError(f"model.hstu.attention: {kind!r} is not one of {', '.join(KINDS)}")
    cost = JAGGED_ATTENTION_COSTS[kind]
    saved = a * tokens * heads * (cost.qkv_copies * qkv + cost.output_copies * h.attn_linear_dim)
    kept = "a copy of q, k and v per token" if cost.qkv_copies else "views of the layer's q, k and v"
    return ActivationPart(f"the attention ({kind})", saved=saved,
                          transient=cost.scratch(heads, rows, h.attn_qk_dim, h.attn_linear_dim),
                          holds=f"{kept}, its scores recomputed in the backward",
                          advice="use a smaller run.global_batch_size")


def _swish_mlp_per_row(in_dim: int, hidden: int, out_dim: int, a: int) -> int:
    """layers.swish_mlp's saved bytes per row: Linear's input, SwishLayerNorm's fp32 input,
    stats, sigmoid and the product, the second Linear's input, LayerNorm32's fp32 input and stats."""
    return a * in_dim + 2 * FP32 * hidden + 2 * FP32 + a * hidden + FP32 * out_dim + 2 * FP32


def input_part(h: HSTUConfig, table_dim: int, batch: int, rows: int, a: int) -> ActivationPart:
    """The preprocessor, the positions and the input dropout (saved), and the looked-up rows
    the forward holds (the fp32 lookups and their history + candidate merges: 2 × 3 tables)."""
    from dlrmtrain.models.hstu.model import ACTION_BITS, HISTORY_ADDITIONAL
    from dlrmtrain.sequence_features import CONTEXTUAL_FEATURES

    contextual, hidden, d = len(CONTEXTUAL_FEATURES), h.preprocessor_hidden_dim, h.dim
    item_rows, tokens = batch * (rows - contextual), batch * rows
    per_item_row = (sum(_swish_mlp_per_row(n, hidden, d, a) for n in (
        table_dim, table_dim * len(HISTORY_ADDITIONAL), len(ACTION_BITS) * h.action_embedding_dim))
        + len(ACTION_BITS) + INT64               # the action bits and the encoder's index
        + INT64 * (1 + len(HISTORY_ADDITIONAL)))  # the history + candidate merges' indices
    per_token = (INT64 * (2 + POSITIONAL_INDEX_TENSORS)  # the contextual merge and the user rows' split
                 + (a * d if h.input_dropout > 0 else 0))
    saved = per_item_row * item_rows + per_token * tokens + a * contextual * table_dim * batch
    tables = 1 + len(HISTORY_ADDITIONAL)
    held = 2 * FP32 * table_dim * (tables * item_rows + contextual * batch)
    return ActivationPart("the input side", saved=saved, held=held,
                          holds="the preprocessor's per-row MLPs, the positions, the fp32 table rows",
                          advice="use a smaller run.global_batch_size")


def candidate_part(h: HSTUConfig, table_dim: int, batch: int, a: int) -> ActivationPart:
    """One row per sample: the postprocessor (under autocast), the item MLP and the head (fp32)."""
    from dlrmtrain.models.hstu.model import ITEM_FEATURES

    d, head = h.dim, h.head_hidden_dim
    per_sample = (a * (2 * d + 4) + 2 * FP32                                  # postprocessor
                  + _swish_mlp_per_row(table_dim * len(ITEM_FEATURES), h.item_mlp_hidden_dim, d, FP32)
                  + FP32 * (3 * d + 3 * head) + 4 * FP32)                     # head and loss
    return ActivationPart("the candidate side", saved=per_sample * batch,
                          holds="the postprocessor, item MLP and head, one row per sample")


def weight_copies_part(h: HSTUConfig, table_dim: int) -> ActivationPart:
    """Under bf16: the bf16 copies of the user tower's weights autocast keeps for the backward
    (its parameters' count, biases and norms included: a few per cent over)."""
    from dlrmtrain.models.hstu.model import ACTION_BITS, HISTORY_ADDITIONAL
    from dlrmtrain.models.hstu.postprocessor import postprocessor_params
    from dlrmtrain.models.hstu.preprocessor import preprocessor_params
    from dlrmtrain.models.hstu.stu import stu_layer_params
    from dlrmtrain.sequence_features import CONTEXTUAL_FEATURES

    tower = (h.num_layers * stu_layer_params(h.dim, h.num_heads, h.attn_qk_dim, h.attn_linear_dim)
             + preprocessor_params(table_dim, h.preprocessor_hidden_dim, h.dim, len(CONTEXTUAL_FEATURES),
                                   len(HISTORY_ADDITIONAL), len(ACTION_BITS), h.action_embedding_dim)
             + postprocessor_params(h.postprocessor, h.dim))
    return ActivationPart("the bf16 copy of the weights", saved=BF16 * tower)


def hstu_activation_memory(h: HSTUConfig, table_dim: int, batch: int, rows: int, precision: str,
                           kind: str) -> ActivationMemory:
    """A training step's activations at `batch` samples of `rows` rows each, `precision`
    (fp32 | bf16), attention kernel `kind` (resolved: attention_kind)."""
    a = activation_bytes(precision)
    layers = h.num_layers
    projection = stu_projection_part(h, batch * rows, a)
    attention = attention_part(h, batch, rows, a, kind)
    parts = [_times(attention, layers), _times(projection, layers),
             input_part(h, table_dim, batch, rows, a), candidate_part(h, table_dim, batch, a)]
    if precision == "bf16":
        parts.append(weight_copies_part(h, table_dim))
    return ActivationMemory(tuple(parts), f"local batch {batch:,} × {rows:,} rows, {layers} STU layers, "
                                          f"{precision}, attention {kind}")


def _times(part: ActivationPart, layers: int) -> ActivationPart:
    """`part` of one layer for `layers` layers: each keeps its own; one scratch at a time."""
    return ActivationPart(part.name, part.saved * layers, part.transient, part.held * layers,
                          f"{part.holds}, {layers} layers", part.advice)
