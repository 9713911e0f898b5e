"""The config-only parameter and FLOP counts against a built model."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from dlrmtrain.models.hstu import build_hstu_model
from dlrmtrain.models.hstu.size import model_size
from dlrmtrain.sequence_features import CONTEXTUAL_FEATURES
from tests.models.hstu_batches import random_batch, tiny_hstu_config
from tests.scripts import load_script

CPU = torch.device("cpu")


@pytest.mark.parametrize("postprocessor", ["timestamp_layer_norm", "layer_norm", "l2_norm"])
def test_parameter_count_equals_the_built_models(postprocessor):
    cfg = tiny_hstu_config(f"model.hstu.postprocessor={postprocessor}", "model.max_table_rows=30")
    model = build_hstu_model(cfg, CPU, table_device=CPU)
    size = model_size(cfg)
    tables = sum(p.numel() for n, p in model.named_parameters() if n.startswith("embedding_collection"))
    dense = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("embedding_collection"))
    assert (size.total_tables, size.total_dense) == (tables, dense)
    for part, count in size.dense_params.items():
        assert count == sum(p.numel() for p in getattr(model, part).parameters()), part


def test_forward_flops_equal_the_counted_matrix_products():
    """Every sample at max_seq_len: torch's FLOP counter over one forward equals the
    model's count, once the attention is charged in full (it is computed padded;
    the count charges its causal half)."""
    cfg = tiny_hstu_config("model.hstu.max_seq_len=16")
    model = build_hstu_model(cfg, CPU, table_device=CPU).eval()
    history = 16 - len(CONTEXTUAL_FEATURES) - 1
    batch = random_batch(torch.Generator().manual_seed(0), batch_size=3, max_history=history,
                         min_history=history)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(batch)
    size = model_size(cfg)
    assert counter.get_total_flops() / 3 == size.full_forward_flops + size.attention_forward_flops


def test_cli_prints_the_counts(tmp_path, capsys):
    config = tmp_path / "hstu.yaml"
    config.write_text("model:\n  arch: dlrmv4_hstu\n  embedding_dim: 16\n  max_table_rows: 100\n")
    load_script("hstu_size").main(["--config", str(config), "model.hstu.num_layers=1"])
    out = capsys.readouterr().out
    size = model_size(tiny_hstu_config("model.embedding_dim=16", "model.max_table_rows=100",
                                       *[f"model.hstu.{k}={v}" for k, v in [
                                           ("max_seq_len", 4096), ("dim", 512), ("num_layers", 1),
                                           ("num_heads", 4), ("attn_qk_dim", 128),
                                           ("attn_linear_dim", 128), ("preprocessor_hidden_dim", 256),
                                           ("item_mlp_hidden_dim", 512), ("head_hidden_dim", 512),
                                           ("num_position_buckets", 8192), ("num_time_buckets", 2048)]]))
    assert f"parameters: {size.total:,}" in out
    assert f"{size.reference_train_flops:,.0f}" in out
