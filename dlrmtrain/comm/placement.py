"""What a run builds for where its codec runs (comm/placement_choice.py: the config's choice,
checked and resolved, torch-free), per collection kind: the placement, asked once.

A codec's work on an embedding all-to-all runs on one of two sides (`declarations.Side`):

- `owner`: its output dist, built by the codec (`EmbeddingCommCodec.make_output_dist`) and put
  on TorchRec's sharded module by the codec sharders (embeddingbag.py, embedding.py); every id
  crosses the id all-to-all, the dist sends back what the codec keeps;
- `sample`: where the batch is made, on the loader's prefetch thread: the codec's `SampleSide`
  turns each batch into what TorchRec's stock dists carry (`dedup`: each feature's distinct
  bags, or each table's distinct ids), gives the sharder whose module takes it and what to
  install after sharding; a codec that chooses per batch (`auto`) also gives the picker the
  trainer asks for each training batch.

`Placement(comm, kind)` is what the sharding, the loaders and the trainer ask: the sharder,
what to install after sharding, the loader's batch transform and the run's counters
(`stats.CommCounters`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torchrec.distributed.types import ModuleSharder

from dlrmtrain.comm.codec import CollectionKind, Side
from dlrmtrain.comm.embedding import CodecEmbeddingCollectionSharder
from dlrmtrain.comm.embeddingbag import CodecEmbeddingBagCollectionSharder
from dlrmtrain.comm.labels import PLACEMENT_KEY
from dlrmtrain.comm.lookups import count_lookups
from dlrmtrain.comm.placement_choice import check, side_of
from dlrmtrain.comm.registry import get_codec
from dlrmtrain.comm.stats import CommCounters
from dlrmtrain.comm.stock_bytes import count_sequence_stock_dists, count_stock_dists
from dlrmtrain.comm.topology import Hierarchy
from dlrmtrain.config.schema import CommConfig

OWNER_SHARDERS = {"pooled": CodecEmbeddingBagCollectionSharder, "sequence": CodecEmbeddingCollectionSharder}
"""each collection kind's sharder at the owner side (its `for_codecs` gives TorchRec's own for `none`)"""


class Placement:
    """Where the run's codec runs on `kind` embeddings, and what that needs: asked once per
    run by the sharding (`sharder`, `after_sharding`) and the trainer (`feed`, the loader's
    batch transform); `counters` is the run's one registry of all-to-all counters."""

    def __init__(self, comm: CommConfig, kind: CollectionKind) -> None:
        self.comm, self.kind = comm, kind
        self.side: Side = side_of(comm)
        check(comm, kind)
        self.counters = CommCounters()
        self._sample = (get_codec(comm.codec).for_run(comm.auto).sample_side(kind)
                        if self.side == "sample" else None)

    def sharder(self, fused_params: dict[str, Any], device_type: str = "cpu") -> ModuleSharder:
        """The sharder of the run's `kind` collection: the sample side's (TorchRec's stock dists
        carry its batches), else TorchRec's own for `none` everywhere or the codec sharder."""
        if self._sample is not None:
            return self._sample.sharder(fused_params)
        c = self.comm
        return OWNER_SHARDERS[self.kind].for_codecs(c.codec, dict(c.table_codecs), fused_params, device_type,
                                                    Hierarchy.of(c), c.auto, self.counters)

    def after_sharding(self, model: nn.Module) -> CommCounters:
        """Install what the side needs on the sharded `model`, and count what TorchRec's stock
        dists carry (at the sample side: the codec's batches) and what each lookup takes."""
        carried = "none"
        if self._sample is not None:
            self._sample.install(model)
            carried = self.comm.codec
        if self.kind == "pooled":
            count_stock_dists(model, self.counters, carried)
            count_lookups(model, self.counters)  # ids and rows each lookup takes, every codec alike
        else:
            count_sequence_stock_dists(model, self.counters, carried)
        return self.counters

    def feed(self, model: nn.Module, data: Any, device: torch.device) -> Any:
        """At the sample side: give `data`'s loaders (`Datasets.set_sparse_transform`) the codec's
        batch transform for the sharded `model`, and return its per-batch picker (`pick(batch)`,
        `pick_for_eval`, `step_ended`; `auto`), None where every batch is transformed. At the
        owner: nothing, None."""
        if self._sample is None:
            return None
        picker = self._sample.picker(device, self.counters)
        data.set_sparse_transform(self.batch_transform(model), keep_full=picker is not None)
        return picker

    def batch_transform(self, model: nn.Module) -> Callable:
        """The sample side's batch transform for the sharded `model` (what `feed` gives the
        loaders): tables whose codec does not dedup travel whole where the side keeps them so."""
        if self._sample is None:
            raise ValueError(f"{PLACEMENT_KEY}: owner: the batches are not transformed where they are made")
        whole = frozenset(t for t, name in self.comm.table_codecs.items() if not get_codec(name).dedups)
        return self._sample.transform(model, whole)
