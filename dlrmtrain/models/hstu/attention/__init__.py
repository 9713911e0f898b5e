"""HSTU's pointwise attention, SiLU(q·k · alpha) / N under the causal, target-aware mask:
the mask (mask.py) and the kernels that compute it (padded.py: the [B, H, N, N] parity
reference; blocked.py: jagged tiles in plain PyTorch; triton_kernels.py: Triton, imported only
where it runs), and the one map from `model.hstu.attention` to a kernel (kinds.py)."""

from dlrmtrain.models.hstu.attention.blocked import blocked_silu_attention
from dlrmtrain.models.hstu.attention.mask import attention_mask
from dlrmtrain.models.hstu.attention.padded import padded_silu_attention

__all__ = ["attention_mask", "blocked_silu_attention", "padded_silu_attention"]
