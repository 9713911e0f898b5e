"""Numeric precision of a training step, in one place.

| mode | dense MLPs & interaction | embedding tables, optimizer state | embedding all-to-all |
|------|--------------------------|-----------------------------------|----------------------|
| fp32 | fp32                     | fp32                              | fp32                 |
| bf16 | bf16 autocast (weights and their grads stay fp32) | fp32     | GPU: bf16 (the lookup emits bf16); CPU: fp32 (fbgemm's CPU lookup cannot emit bf16) |

The loss (BCE with logits) is computed in fp32 under autocast. fp16 is not
offered: it needs loss scaling, and TorchRec's fused embedding optimizers
update the tables inside the backward pass, before a scaler could unscale the
gradient or skip a step with inf/NaN; bf16 has fp32's range and needs no
scaling, so it is the mixed-precision mode on CPU and GPU alike.
"""

from __future__ import annotations

import contextlib

import torch
from fbgemm_gpu.split_embedding_configs import SparseType


def autocast(mode: str, device: torch.device):
    """The context the forward pass runs in."""
    if mode == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def embedding_output_dtype(mode: str, device_type: str) -> SparseType:
    """What the fused lookup emits, hence what the embedding all-to-all carries."""
    return SparseType.BF16 if mode == "bf16" and device_type == "cuda" else SparseType.FP32
