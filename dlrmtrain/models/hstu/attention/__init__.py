"""HSTU's pointwise attention, SiLU(q·k · alpha) / N under the causal, target-aware mask:
the mask (mask.py) and the kernels that compute it (padded.py: the [B, H, N, N] parity
reference)."""

from dlrmtrain.models.hstu.attention.mask import attention_mask
from dlrmtrain.models.hstu.attention.padded import padded_silu_attention

__all__ = ["attention_mask", "padded_silu_attention"]
