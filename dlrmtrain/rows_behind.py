"""The one method a pooled lookup's output may offer the model's interaction: its rows behind a
leading row per sample, in one gather.

DLRM's interaction (models/dlrm.py) concatenates each sample's dense row before its pooled rows,
[B, 1 + F, D]. Where the lookup's output holds its rows not yet expanded to the batch (dedup at
the sample side: the distinct bags' rows and each sample's index into them,
comm/torchrec/pooled_source.py's `ExpandedRows`), that concatenation is one gather of the dense
and the distinct rows, and neither the B·F·D expand nor its copy into the concatenation is made.
The output says so by being a `RowsBehind`; the model asks `isinstance(pooled, RowsBehind)` and
calls `behind`, knowing nothing of how the rows arrived. Both sides import this module (it stands
below comm/ and models/, which may not import each other).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class RowsBehind(ABC):
    """A pooled lookup output (a KeyedTensor: keys, widths, values [B, K·d]) that can also give
    its rows behind a leading row per sample."""

    @abstractmethod
    def behind(self, leading: torch.Tensor) -> torch.Tensor | None:
        """[B, 1 + K·d/D, D]: each sample's `leading` row [B, D] first, then its K rows in the
        keys' order (d-wide rows in D-wide blocks), as `cat((leading.unsqueeze(1),
        values.view(B, -1, D)), 1)` would give, bitwise, forward and backward; None where it
        cannot (then the caller reads the values as from any KeyedTensor): e.g. the values were
        read already, or `leading` differs in dtype, batch size, or a width the rows fit."""
