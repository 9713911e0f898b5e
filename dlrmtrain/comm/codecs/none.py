"""`none`: TorchRec's stock output dist, untouched."""

from __future__ import annotations

import torch.nn as nn

from dlrmtrain.comm.codec import CollectionKind, DistSpec, EmbeddingCommCodec
from dlrmtrain.comm.declarations import BUILT_IN


class NoneCodec(EmbeddingCommCodec):
    def __init__(self) -> None:
        self.declare(BUILT_IN["none"])

    def supports(self, sharding_type: str, kind: CollectionKind = "pooled") -> bool:
        return True

    def make_output_dist(self, spec: DistSpec) -> nn.Module:
        return spec.stock_dist
