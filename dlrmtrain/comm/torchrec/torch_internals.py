"""torch's private internals the codec layer reads."""

from __future__ import annotations

import torch


def storage_use_count(t: torch.Tensor) -> int:
    """How many tensors/views share `t`'s storage (torch has no public accessor)."""
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)
