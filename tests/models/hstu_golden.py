"""The golden DLRMv4 case: one small configuration, weights and batches that both
dlrmtrain's model and the MLPerf reference's PyTorch modules are given, so that their
figures can be compared bitwise (tests/models/test_hstu_golden.py; how the reference's
figures were made: tests/models/golden/README.md).

Weights come from a recipe keyed on each parameter's dlrmtrain name (not from either
model's init, whose module order differs), and the reference receives them under its
own names (`reference_name`). Timestamps are what Yambda has: a 5-second grid,
histories spanning months, query times near 1e7 s and near 1.7e9 s.
"""

from __future__ import annotations

import hashlib
import zlib
from pathlib import Path

import numpy as np
import torch

from dlrmtrain.config import load_config
from dlrmtrain.config.schema import Config
from dlrmtrain.sequence_features import TABLES, SequenceBatch
from tests.models.hstu_batches import make_batch

GOLDEN_FILE = Path(__file__).parent / "golden" / "dlrmv4_reference.npz"
TABLE_ROWS = 64
GOLDEN_HSTU = [
    "model.arch=dlrmv4_hstu", "model.embedding_dim=8", f"model.max_table_rows={TABLE_ROWS}",
    "model.hstu.max_seq_len=64", "model.hstu.dim=2049",  # = time-table rows, see OLD_GAPS_S "model.hstu.num_layers=2",
    "model.hstu.num_heads=2", "model.hstu.attn_qk_dim=4", "model.hstu.attn_linear_dim=4",
    "model.hstu.preprocessor_hidden_dim=16",
    # widths the reference hard-codes (item MLP and head 512, action dim 8, 8192 / 2048 buckets)
    "model.hstu.item_mlp_hidden_dim=512", "model.hstu.head_hidden_dim=512",
    "model.hstu.action_embedding_dim=8", "model.hstu.num_position_buckets=8192",
    "model.hstu.num_time_buckets=2048",
    "model.hstu.input_dropout=0", "model.hstu.linear_dropout=0",
    # the reference's PyTorch kernel, whatever `auto` picks: the bitwise claims are padded's
    "model.hstu.attention=padded",
]
QUERY_TIMES = {"t1e7": 10_000_000, "t1p7e9": 1_700_000_000}
"""Batch name → about when its candidates are scored (seconds)."""
GRID_S = 5
HISTORY_SPAN_S = 9_000_000
"""About 104 days: how far back a history's events are spread."""
OLD_GAPS_S = [64_397_755, 63_160_550]
"""Events about two years back in the later batch's long histories, at gaps on the 5 s
grid where an fp32 and a float64 time bucket disagree (1026 vs 1025, 1036 vs 1035).
The reference's PyTorch kernel caps buckets at the transducer width − 1, its Triton
kernel (which dlrmtrain follows) at the time table's rows − 1 (2048): the golden width
is 2049 so that both caps are the same bucket, the one the contextual tokens (timestamp
0) land in at 1.7e9 s."""
FULL_VALUES_UP_TO = 600
"""Figures with more elements are kept as a SHA-256 of their bytes (bitwise all the
same) and a fixed sample of their values (to show how far off a mismatch is)."""
SAMPLE = 32


def golden_config() -> Config:
    return load_config(None, GOLDEN_HSTU)


def golden_weight(name: str, shape: torch.Size) -> torch.Tensor:
    """A fixed fp32 tensor per parameter name: norm scales near 1, biases near 0,
    matrices Xavier-sized; a name's values do not depend on any other parameter."""
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    u = torch.rand(shape, generator=gen, dtype=torch.float32) * 2 - 1
    if len(shape) == 1:
        return 1 + 0.1 * u if name.endswith("weight") else 0.1 * u
    return u * (6.0 / (shape[-2] + shape[-1])) ** 0.5


def load_golden_weights(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(golden_weight(name, p.shape))


_REFERENCE_PREFIXES = [
    ("embedding_collection.", "_embedding_collection."),
    ("preprocessor.contextual_weight", "_hstu_transducer._input_preprocessor._batched_contextual_linear_weights"),
    ("preprocessor.contextual_bias", "_hstu_transducer._input_preprocessor._batched_contextual_linear_bias"),
    ("preprocessor.content_mlp.", "_hstu_transducer._input_preprocessor._content_embedding_mlp."),
    ("preprocessor.additional_mlp.", "_hstu_transducer._input_preprocessor._additional_embedding_mlp."),
    ("preprocessor.action_mlp.", "_hstu_transducer._input_preprocessor._action_embedding_mlp."),
    ("preprocessor.action_encoder.action_table", "_hstu_transducer._input_preprocessor._action_encoder._action_embedding_table"),
    ("preprocessor.action_encoder.target_action", "_hstu_transducer._input_preprocessor._action_encoder._target_action_embedding_table"),
    ("positional.position_table", "_hstu_transducer._positional_encoder._position_embeddings_weight"),
    ("positional.time_table", "_hstu_transducer._positional_encoder._timestamp_embeddings_weight"),
    ("stu.layers.", "_hstu_transducer._stu_module._stu_layers."),
    ("postprocessor.combiner.", "_hstu_transducer._output_postprocessor._time_feature_combiner."),
    ("postprocessor.norm.", "_hstu_transducer._output_postprocessor._layer_norm."),
    ("item_mlp.", "_item_embedding_mlp."),
    ("head.mlp.", "_multitask_module._prediction_module."),
]
_REFERENCE_LEAVES = {"uvqk_weight": "_uvqk_weight", "uvqk_bias": "_uvqk_beta",
                     "input_norm_weight": "_input_norm_weight", "input_norm_bias": "_input_norm_bias",
                     "output_weight": "_output_weight", "output_norm_weight": "_output_norm_weight",
                     "output_norm_bias": "_output_norm_bias"}


def reference_name(name: str) -> str:
    """dlrmtrain parameter name → the reference DlrmHSTU's name for the same tensor."""
    for ours, theirs in _REFERENCE_PREFIXES:
        if name.startswith(ours):
            rest = name[len(ours):]
            if ours == "stu.layers.":
                layer, leaf = rest.split(".", 1)
                rest = f"{layer}.{_REFERENCE_LEAVES[leaf]}"
            return theirs + rest
    raise KeyError(f"no reference name for {name}")


def _history(gen: torch.Generator, length: int, query_time: int, old_gaps: list[int]
             ) -> list[int]:
    """`length` event times on the 5 s grid, oldest first, the last one at `query_time`
    (the data sets the candidate's query time to the last event's); gaps from seconds
    to months."""
    if length == 0:
        return []
    steps = torch.rand(length - 1, generator=gen) ** 3 * HISTORY_SPAN_S / max(length - 1, 1)
    back = torch.cumsum(torch.flip(steps, [0]), 0).flip(0)
    times = sorted(query_time - int(b) // GRID_S * GRID_S for b in back.tolist())
    if length > 2 * len(old_gaps):
        times[:len(old_gaps)] = [query_time - gap for gap in old_gaps]
    return times + [query_time]


def golden_batches() -> dict[str, SequenceBatch]:
    """Two batches of 6 samples (histories 0..40 events), one per QUERY_TIMES entry."""
    batches = {}
    for k, (name, around) in enumerate(QUERY_TIMES.items()):
        gen = torch.Generator().manual_seed(27 + k)
        histories, candidates, users = [], [], []
        for length in (0, 1, 5, 17, 31, 40):  # 8 + 40 + 1 rows at most
            query = around + int(torch.randint(0, 200_000, (1,), generator=gen)) * GRID_S
            items = torch.randint(0, TABLE_ROWS, (length + 1,), generator=gen).tolist()
            bits = torch.randint(0, 8, (length + 1,), generator=gen).tolist()
            times = _history(gen, length, query, OLD_GAPS_S if around > OLD_GAPS_S[0] else [])
            histories.append([(i, i * 5 % TABLE_ROWS, i * 3 % TABLE_ROWS, b, t)
                              for i, b, t in zip(items, bits, times)])
            c = items[-1]
            candidates.append((c, c * 5 % TABLE_ROWS, c * 3 % TABLE_ROWS, bits[-1],
                               times[-1] if times else query))
            users.append(int(torch.randint(0, TABLE_ROWS, (1,), generator=gen)))
        batches[name] = make_batch(histories, candidates, users, rows=TABLE_ROWS)
    return batches


def golden_record(key: str, t: torch.Tensor) -> dict[str, np.ndarray]:
    """How one figure is kept in the golden file (-0.0 stored as 0.0)."""
    values = t.detach().contiguous().numpy().astype(np.float32) + np.float32(0)
    if values.size <= FULL_VALUES_UP_TO:
        return {key: values}
    flat = values.reshape(-1)
    return {f"{key}#sha256": np.array(hashlib.sha256(flat.tobytes()).hexdigest()),
            f"{key}#sample": flat[np.linspace(0, flat.size - 1, SAMPLE).astype(np.int64)]}


def golden_parameter_names() -> list[str]:
    """dlrmtrain's parameter names for the golden configuration (nothing allocated)."""
    from dlrmtrain.models.hstu import DlrmHSTU

    cfg, meta = golden_config(), torch.device("meta")
    return [n for n, _ in DlrmHSTU(cfg.model.hstu, cfg.model.embedding_dim, table_rows(), meta,
                                   meta).named_parameters()]


def table_rows() -> dict[str, int]:
    return {name: TABLE_ROWS for name in TABLES}
