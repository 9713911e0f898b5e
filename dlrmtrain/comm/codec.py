"""The codec interface: what the sharder asks of a pooled-embedding codec.

A codec decides, per sharding type, whether it can carry an all-to-all and, if
so, builds the output dist that replaces TorchRec's. It sees the stock dist
(for its process group and callbacks), the wire layout and the tables it is
asked to encode. TorchRec's own `QuantizedCommCodec` hook cannot express a
lossless, data-dependent codec (its message size must be a function of the
shape, and it never sees the ids), hence this small interface of our own.
"""

from __future__ import annotations

from typing import Protocol

import torch.distributed as dist
import torch.nn as nn

from dlrmtrain.comm.layout import DistLayout


class EmbeddingCommCodec(Protocol):
    name: str
    """the name used in config (`comm.codec`, `comm.table_codecs`)"""
    lossless: bool
    """True when training is the same as without the codec (up to float summation order)"""

    def supports(self, sharding_type: str) -> bool:
        """Whether this codec can replace the output dist of `sharding_type`."""
        ...

    def make_output_dist(self, stock_dist: nn.Module, layout: DistLayout, tables: set[str],
                         pg: dist.ProcessGroup, sharding_type: str) -> nn.Module:
        """The output dist carrying `tables` with this codec (the rest travel uncompressed)."""
        ...
