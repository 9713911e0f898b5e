"""The activation models (models/dlrm_activations.py, models/hstu/activations.py) against the
bytes autograd actually keeps, measured with torch.autograd.graph.saved_tensors_hooks: every
tensor a forward saves for its backward, counted once per storage (views share one) and
without the parameters (the memory check counts those as dense state). Deterministic: the
same shapes save the same tensors.

Within WITHIN either way: the formulas name every tensor that grows with the batch or the
sequence, and leave out or approximate only what does not: a few [B] int64 vectors (lengths,
offsets) and, under bf16, the weight copies counted from the parameter count (autocast copies
the weights of its matmuls, not the biases and norm weights the count includes). At these
shapes that is under 2.5 %; a formula missing one per-token tensor would be off by 5-30 %."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dlrmtrain.config import load_config
from dlrmtrain.features import TABLE_NAMES
from dlrmtrain.models.dlrm_activations import dlrm_activation_memory
from dlrmtrain.models.hstu import build_hstu_model, jagged
from dlrmtrain.models.hstu.activations import (
    attention_kind, attention_part, hstu_activation_memory, stu_projection_part, with_attention)
from dlrmtrain.models.hstu.attention.blocked import chunk_scratch_bytes
from dlrmtrain.models.hstu.stu import STULayer
from dlrmtrain.workloads import workload_of
from tests.models.hstu_batches import random_batch, tiny_hstu_config

WITHIN = 1.05
CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[2]


def saved_bytes(forward, parameters) -> int:
    """Bytes of the distinct storages autograd saves while `forward()` runs, parameters excluded."""
    excluded = {p.untyped_storage().data_ptr() for p in parameters}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in excluded:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward()
    return sum(seen.values())


def assert_within(estimate: int, measured: int) -> None:
    assert measured > 0 and 1 / WITHIN <= estimate / measured <= WITHIN, (estimate, measured)


@pytest.mark.parametrize("precision, dropout, kind", [("fp32", 0.1, "padded"), ("bf16", 0.1, "padded"),
                                                     ("fp32", 0.0, "padded"), ("fp32", 0.1, "blocked"),
                                                     ("bf16", 0.1, "blocked")])
def test_one_stu_layer_saves_what_the_model_says(precision, dropout, kind):
    cfg = load_config(None, ["model.hstu.dim=64", "model.hstu.num_heads=2", "model.hstu.attn_qk_dim=16",
                             "model.hstu.attn_linear_dim=24", f"model.hstu.linear_dropout={dropout}"])
    h = cfg.model.hstu
    batch, rows, bf16 = 3, 96, precision == "bf16"
    torch.manual_seed(0)
    layer = STULayer(h.dim, h.num_heads, h.attn_qk_dim, h.attn_linear_dim, h.linear_dropout, kind)
    lengths = torch.full((batch,), rows, dtype=torch.int64)
    # the layer's input is what the previous one returns: bf16 under bf16 autocast
    x = torch.randn(batch * rows, h.dim, dtype=torch.bfloat16 if bf16 else torch.float32, requires_grad=True)

    def forward():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            layer(x, jagged.offsets_of(lengths), lengths, torch.ones(batch, dtype=torch.int64), rows)

    a = 2 if bf16 else 4
    estimate = (stu_projection_part(h, batch * rows, a).saved + attention_part(h, batch, rows, a, kind).saved
                + (2 * (h.dim * h.num_heads * (2 * h.attn_qk_dim + 2 * h.attn_linear_dim)
                        + 3 * h.num_heads * h.attn_linear_dim * h.dim) if bf16 else 0))  # the two weight copies
    assert_within(estimate, saved_bytes(forward, layer.parameters()))


@pytest.mark.parametrize("precision, kind", [("fp32", "padded"), ("bf16", "padded"), ("bf16", "blocked")])
def test_the_whole_hstu_model_saves_what_the_model_says(precision, kind):
    history = 55
    cfg = tiny_hstu_config(f"model.hstu.max_seq_len={history + 9}", "model.hstu.dim=64", "model.embedding_dim=32",
                           "model.hstu.num_heads=2", "model.hstu.attn_qk_dim=16", "model.hstu.attn_linear_dim=16",
                           "model.hstu.preprocessor_hidden_dim=48", "model.hstu.num_position_buckets=128",
                           f"precision.mode={precision}", f"model.hstu.attention={kind}")
    model = build_hstu_model(cfg, CPU, table_device=CPU)
    batch = random_batch(torch.Generator().manual_seed(0), batch_size=4, max_history=history, min_history=history)
    emb = dict(model.embedding_collection(batch.sparse).items())  # the looked-up rows: the forward's input
    estimate = hstu_activation_memory(cfg.model.hstu, cfg.model.embedding_dim, 4, history + 9, precision, kind)
    assert_within(estimate.saved, saved_bytes(lambda: model.loss_and_outputs(batch, emb), model.parameters()))


@pytest.mark.parametrize("arch", ["dlrm_v1", "dlrm_dcnv2"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_small_dlrm_forward_saves_what_the_model_says(arch, precision):
    cfg = load_config(None, [f"model.arch={arch}", "model.embedding_dim=16", "model.bottom_mlp=[32,16]",
                             "model.top_mlp=[64,32,1]", "model.dcn_low_rank_dim=8", "model.dcn_num_layers=2",
                             f"precision.mode={precision}"])
    workload = workload_of(cfg)
    rows = {name: 10 for name in TABLE_NAMES}
    dlrm = workload.build_model(cfg, rows, CPU).model
    batch, tables, bf16 = 256, len(rows), precision == "bf16"
    dense = torch.randn(batch, cfg.data.num_dense_features)
    pooled = torch.randn(batch, tables, cfg.model.embedding_dim, requires_grad=True)  # the lookup's output

    def forward():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = dlrm.over_arch(dlrm.inter_arch(dense_features=dlrm.dense_arch(dense), sparse_features=pooled))
            torch.nn.functional.binary_cross_entropy_with_logits(logits.squeeze(-1), torch.zeros(batch))

    dense_parameters = sum(p.numel() for p in dlrm.parameters() if p.device.type == "cpu")
    estimate = dlrm_activation_memory(cfg.model, cfg.data.num_dense_features, tables, batch, precision,
                                      arch == "dlrm_dcnv2", dense_parameters)
    measured = saved_bytes(forward, [p for p in dlrm.parameters() if p.device.type == "cpu"])
    assert_within(estimate.saved, measured)


def test_padded_attention_grows_with_the_padded_length_the_jagged_kernels_with_the_tokens():
    """At a fixed token count, padded's scores double with N (B·N²; its per-token q, k, v
    copies do not) while the jagged kernels' bytes stay put: triton's copy of q, k and v per
    token, nothing of blocked's own (it keeps the views of the layer's q, k, v it is given)."""
    h = load_config(REPO / "configs/mlperf_dlrmv4.yaml").model.hstu
    for kind, per_token in (("blocked", 0), ("triton", 2 * h.num_heads * (2 * h.attn_qk_dim + h.attn_linear_dim))):
        short, long = attention_part(h, 8, 512, 2, kind), attention_part(h, 4, 1024, 2, kind)
        assert short.saved == long.saved == per_token * 8 * 512
    short, long = attention_part(h, 8, 512, 2, "padded"), attention_part(h, 4, 1024, 2, "padded")
    assert 1.7 < long.saved / short.saved < 2.0 and long.transient == 2 * short.transient


def test_blocked_scratch_is_one_chunk_whatever_the_batch_and_the_padded_length():
    h = load_config(REPO / "configs/mlperf_dlrmv4.yaml").model.hstu
    small, large = attention_part(h, 2, 512, 2, "blocked"), attention_part(h, 1024, 512, 2, "blocked")
    assert small.transient == large.transient > 0
    # its tiles are square (rows × keys), so no pair grows with N
    assert attention_part(h, 1, 1024, 2, "blocked").transient == small.transient
    assert attention_part(h, 1, 8192, 2, "blocked").transient == small.transient
    # a pair larger than the chunk budget runs alone: the scratch is then one pair's
    tiny_budget = chunk_scratch_bytes(h.num_heads, 8192, h.attn_qk_dim, h.attn_linear_dim, chunk_bytes=1)
    assert tiny_budget == chunk_scratch_bytes(h.num_heads, 64, h.attn_qk_dim, h.attn_linear_dim, chunk_bytes=1)
    assert 0 < tiny_budget < small.transient
    assert attention_part(h, 1, 4096, 2, "triton").transient == 0  # its tiles live on the chip


def test_the_attention_kind_is_the_models_own_rule_auto_by_device_and_length():
    """activations.attention_kind asks attention/kinds.py, the rule the model is built with."""
    cfg = load_config(None)
    h = cfg.model.hstu
    for kind in ("padded", "blocked", "triton"):
        h.attention = kind
        assert attention_kind(h, "cuda") == attention_kind(h, "cpu") == kind
    h.attention = "auto"
    assert (attention_kind(h, "cuda"), attention_kind(h, "cpu")) == ("triton", "blocked")  # 4,096 rows
    h.max_seq_len = 64
    assert (attention_kind(h, "cuda"), attention_kind(h, "cpu")) == ("triton", "padded")
    assert with_attention(cfg, "blocked").model.hstu.attention == "blocked" and h.attention == "auto"
