"""`none`: TorchRec's stock output dist, untouched."""

from __future__ import annotations

import torch.nn as nn

from dlrmtrain.comm.codec import CollectionKind, DistSpec, EmbeddingCommCodec


class NoneCodec(EmbeddingCommCodec):
    name = "none"
    lossless = True
    dedups = False
    sides = frozenset({"owner", "sample"})  # its tables travel whole through the stock dist either way
    runs_under_two_levels = True  # a table left whole under two-level dedup

    def supports(self, sharding_type: str, kind: CollectionKind = "pooled") -> bool:
        return True

    def make_output_dist(self, spec: DistSpec) -> nn.Module:
        return spec.stock_dist
