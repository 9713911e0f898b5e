"""`none`: TorchRec's stock output dist, untouched."""

from __future__ import annotations

import torch.distributed as dist
import torch.nn as nn

from dlrmtrain.comm.codec import EmbeddingCommCodec
from dlrmtrain.comm.layout import Layout


class NoneCodec(EmbeddingCommCodec):
    name = "none"
    lossless = True

    def supports(self, sharding_type: str) -> bool:
        return True

    def make_output_dist(self, stock_dist: nn.Module, layout: Layout | None, tables: set[str],
                         pg: dist.ProcessGroup, sharding_type: str) -> nn.Module:
        return stock_dist
