"""What runs in which dtype under `precision.mode: bf16` (dlrmtrain/precision.py's
table): DLRMv4's user tower under bf16 autocast and its item MLP, head and logits in
fp32; DLRM v1 / DCNv2's logit layer in fp32; so every family's eval scores are fp32."""

from __future__ import annotations

import pytest
import torch

from dlrmtrain.config import load_config
from dlrmtrain.workloads.dlrm import build_dlrm_model
from dlrmtrain.models.hstu import build_hstu_model
from dlrmtrain.precision import autocast
from dlrmtrain.workloads import workload_of
from tests.models.hstu_batches import random_batch, tiny_hstu_config

CPU = torch.device("cpu")


def _output_dtypes(model: torch.nn.Module, parts: list[str]) -> dict[str, torch.dtype]:
    seen: dict[str, torch.dtype] = {}
    for name in parts:
        model.get_submodule(name).register_forward_hook(
            lambda _m, _i, out, name=name: seen.__setitem__(name, out.dtype))
    return seen


def test_dlrmv4_bf16_runs_the_user_tower_only_under_autocast():
    cfg = tiny_hstu_config("precision.mode=bf16")
    model = build_hstu_model(cfg, CPU, table_device=CPU)
    seen = _output_dtypes(model, ["preprocessor.content_mlp.0", "stu.layers.1",
                                  "postprocessor.combiner", "item_mlp", "head"])
    batch = random_batch(torch.Generator().manual_seed(3), batch_size=4, max_history=6)
    with autocast(cfg.precision.mode, CPU, workload_of(cfg).model_scopes_its_own_autocast):  # the trainer's context: none
        loss, (_, logits, _) = model(batch)
    assert seen == {"preprocessor.content_mlp.0": torch.bfloat16, "stu.layers.1": torch.bfloat16,
                    "postprocessor.combiner": torch.bfloat16,
                    "item_mlp": torch.float32, "head": torch.float32}
    assert logits.dtype == torch.float32 and loss.dtype == torch.float32
    fp32 = build_hstu_model(tiny_hstu_config(), CPU, table_device=CPU)
    fp32.load_state_dict(model.state_dict())
    seen_fp32 = _output_dtypes(fp32, ["stu.layers.1"])
    fp32(batch)
    assert seen_fp32 == {"stu.layers.1": torch.float32}


@pytest.mark.parametrize("arch", ["dlrm_v1", "dlrm_dcnv2"])
def test_dlrm_bf16_computes_its_logits_in_fp32(arch):
    cfg = load_config(None, [f"model.arch={arch}", "precision.mode=bf16", "model.embedding_dim=8",
                             "model.bottom_mlp=[16,8]", "model.top_mlp=[16,8,1]",
                             "model.dcn_low_rank_dim=4"])
    dlrm = build_dlrm_model(cfg, [20] * 26, CPU).model
    dense = torch.randn(64, cfg.data.num_dense_features, generator=torch.Generator().manual_seed(1))
    seen = _output_dtypes(dlrm, ["over_arch.model.0", "over_arch.model.1"])
    with autocast(cfg.precision.mode, CPU, workload_of(cfg).model_scopes_its_own_autocast):
        pooled = torch.randn(64, 26, 8, generator=torch.Generator().manual_seed(2))
        logits = dlrm.over_arch(dlrm.inter_arch(dense_features=dlrm.dense_arch(dense),
                                                sparse_features=pooled))
    assert seen == {"over_arch.model.0": torch.bfloat16, "over_arch.model.1": torch.float32}
    # fp32 scores: bf16 would hold at most 2^8 values per octave, and tie
    assert logits.dtype == torch.float32 and not torch.equal(logits, logits.bfloat16().float())
