"""The codec interface: everything the sharder, the registry and config validation ask of a codec.

A codec decides, per sharding type, whether it can carry an all-to-all and, if
so, builds the output dist that replaces TorchRec's. It sees the stock dist
(for its process group and callbacks), the wire layout and the tables it is
asked to encode. TorchRec's own `QuantizedCommCodec` hook cannot express a
lossless, data-dependent codec (its message size must be a function of the
shape, and it never sees the ids), hence this interface of our own; codecs
that are TorchRec's qcomms say so through `qcomms_config`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch.distributed as dist
import torch.nn as nn

from dlrmtrain.comm.layout import Layout

if TYPE_CHECKING:
    from torchrec.distributed.fbgemm_qcomm_codec import QCommsConfig
    from torchrec.distributed.types import QuantizedCommCodecs


class EmbeddingCommCodec(ABC):
    name: str
    """the name used in config (`comm.codec`, `comm.table_codecs`)"""
    lossless: bool
    """True when training is the same as without the codec (up to float summation order)"""
    needs_ids: bool = False
    """True when its dists read both ends' ids (recorded by the sharder; no per-id weights)"""

    def qcomms_config(self) -> QCommsConfig | None:
        """TorchRec's quantized-comms config when this codec is one (applies to the whole sharder), else None."""
        return None

    def qcomm_codecs_registry(self, device_type: str) -> dict[str, QuantizedCommCodecs] | None:
        """The `qcomm_codecs_registry` to hand TorchRec's sharder on `device_type`, or None."""
        return None

    def check_device(self, device_type: str, where: str = "comm.codec") -> None:
        """Raise a config-time error naming `where` if this codec cannot run on `device_type`."""

    def wire_bytes_per_value(self) -> float:
        """Bytes one fp32 embedding value takes on the wire."""
        return 4.0

    @abstractmethod
    def supports(self, sharding_type: str) -> bool:
        """Whether this codec can replace the output dist of `sharding_type`."""

    @abstractmethod
    def make_output_dist(self, stock_dist: nn.Module, layout: Layout | None, tables: set[str],
                         pg: dist.ProcessGroup, sharding_type: str) -> nn.Module:
        """The output dist carrying `tables` with this codec (the rest travel uncompressed).

        `layout` is a `DistLayout` for table-/column-wise, a `RowWiseLayout` for
        row-wise, None for sharding types without one. Returning `stock_dist`
        itself means "nothing to change".
        """
