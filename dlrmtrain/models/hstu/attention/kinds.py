"""The one map from `model.hstu.attention` to a kernel, and the rule that resolves `auto`.

    padded   padded.py: [B, H, N, N] scores, the parity reference (the reference's PYTORCH kernel)
    blocked  blocked.py: jagged (row tile, key tile) pairs in plain PyTorch, any device
    triton   triton_kernels.py: jagged Triton kernels, CUDA (CPU only under TRITON_INTERPRET=1)
    auto     triton on CUDA; on CPU padded up to CPU_PADDED_UP_TO_ROWS rows, blocked above

The model resolves its kind once, when it is built (`resolve`, then `kernel`); the memory
model (models/hstu/activations.py) asks the same `resolve`, so both follow one rule. Every
kernel takes (q, k, v, offsets, lengths, num_targets, max_len, alpha) and returns [L, H·dv].
Triton is imported only when its kernel is asked for: reading TRITON_INTERPRET happens at
that import, and a CPU run of the other kernels needs no Triton at all.
"""

from __future__ import annotations

from typing import Callable

import torch

from dlrmtrain.config.schema import HSTUAttention, choices

KINDS = ("padded", "blocked", "triton")
"""The kernels a resolved `model.hstu.attention` names (schema.HSTUAttention: these and `auto`)."""

CPU_PADDED_UP_TO_ROWS = 128
"""`auto` on CPU: padded while model.hstu.max_seq_len is at most this, blocked above. At short
sequences padded's sequences padded's few large products beat blocked's recomputed scores and gathers (one STU
layer, forward + backward, at mini_dlrmv4's widths, 2 heads, half to full fill: blocked took
1.36× padded's time at 64 rows, 1.1× at 128, 0.87× at 256 and 0.47× at 512; docs/design.md
§8). A speed choice only: both train the same model."""

AttentionKernel = Callable[..., torch.Tensor]


def resolve(kind: str, device_type: str, max_seq_len: int) -> str:
    """The kernel `kind` names on `device_type` for sequences up to `max_seq_len` rows: itself,
    or for `auto` triton on CUDA, padded or blocked on CPU (CPU_PADDED_UP_TO_ROWS)."""
    if kind not in choices(HSTUAttention):
        raise ValueError(f"model.hstu.attention: {kind!r} is not one of {', '.join(choices(HSTUAttention))}")
    if kind != "auto":
        return kind
    if device_type == "cuda":
        return "triton"
    return "padded" if max_seq_len <= CPU_PADDED_UP_TO_ROWS else "blocked"


def kernel(kind: str) -> AttentionKernel:
    """The attention function of a resolved `kind` (one of KINDS)."""
    if kind == "padded":
        from dlrmtrain.models.hstu.attention.padded import padded_silu_attention

        return padded_silu_attention
    if kind == "blocked":
        from dlrmtrain.models.hstu.attention.blocked import blocked_silu_attention

        return blocked_silu_attention
    if kind == "triton":
        from dlrmtrain.models.hstu.attention.triton_kernels import triton_silu_attention

        return triton_silu_attention
    raise ValueError(f"model.hstu.attention: {kind!r} is not a resolved kind ({', '.join(KINDS)}); "
                     f"resolve `auto` first")
