"""`auto`: lossless; per all-to-all (and per table) `none` or `dedup`, whichever measures faster.

The registry entry: it builds the dedup dist of the same spec (two levels under
`comm.hierarchy: node`) and puts an `AutoDist` (dist.py; sequence all-to-alls:
`SequenceAutoDist`, sequence.py) over it and the stock dist.
"""

from __future__ import annotations

import dataclasses

import torch.nn as nn

from dlrmtrain.comm.auto.dist import AutoDist
from dlrmtrain.comm.auto.policy import AutoPolicy
from dlrmtrain.comm.codec import CollectionKind, DistSpec, EmbeddingCommCodec, SampleSide
from dlrmtrain.comm.declarations import BUILT_IN
from dlrmtrain.comm.dedup.codec import DedupCodec
from dlrmtrain.comm.auto.sequence import SequenceAutoDist
from dlrmtrain.config.schema import AutoConfig


class AutoCodec(EmbeddingCommCodec):
    needs_ids = True  # its dedup path reads both ends' ids

    def __init__(self, settings: AutoConfig | None = None) -> None:
        """`settings`: the run's `comm.auto` (registry.run_codecs); None: the defaults."""
        self.declare(BUILT_IN["auto"])  # lossless, dedups, both sides, two levels (none or dedup's)
        self._dedup = DedupCodec()
        self._policy = AutoPolicy.of(settings or AutoConfig())

    def for_run(self, auto: AutoConfig | None) -> AutoCodec:
        return AutoCodec(auto)

    def sample_side(self, kind: CollectionKind) -> SampleSide:
        """Dedup's sample side, a `SourceAuto` picking each batch's form (auto/source.py)."""
        from dlrmtrain.comm.auto.source import AutoSampleSide

        return AutoSampleSide(self._dedup.sample_side(kind), self._policy)

    def supports(self, sharding_type: str, kind: CollectionKind = "pooled") -> bool:
        return self._dedup.supports(sharding_type, kind)

    def launch_families(self, spec: DistSpec) -> tuple[str, ...] | None:
        return self._dedup.launch_families(spec)  # its dedup path's

    def make_output_dist(self, spec: DistSpec) -> nn.Module:
        dist_type = SequenceAutoDist if spec.kind == "sequence" else AutoDist
        return dist_type(spec, self._dedup.make_output_dist(spec), dataclasses.replace(self._policy))  # fresh state
