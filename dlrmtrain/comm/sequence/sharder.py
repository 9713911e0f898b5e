"""The EmbeddingCollection sharder that installs codecs on TorchRec's sequence-embedding dists.

The sequence counterpart of comm/sharder.py's EBC sharder: TorchRec's
`ShardedEmbeddingCollection` builds one sequence output dist per sharding type
(`TwSequenceEmbeddingDist`, `RwSequenceEmbeddingDist`, both around
`SequenceEmbeddingsAllToAll`); ours replaces those of `dedup` tables with a
`DedupDist` run by a `SequencePlanner` (planner.py), after TorchRec built
them. `none` keeps the stock dist untouched; TorchRec's lossy qcomms (`fp16`,
`bf16`, `int8`) quantize inside the stock dist through the sharder's
`qcomm_codecs_registry`. Both ends' ids are recorded by `IdRecordingShardedEC`
(torchrec_hooks.py). Lookups, the fused optimizer and the state dict stay TorchRec's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.types import ModuleSharder, ShardingEnv
from torchrec.modules.embedding_modules import EmbeddingCollection

from dlrmtrain.comm import torchrec_hooks as hooks
from dlrmtrain.comm.dedup.codec import DedupCodec
from dlrmtrain.comm.dedup.dist import DedupDist
from dlrmtrain.comm.layout import DistLayout, Layout, layout_for
from dlrmtrain.comm.registry import codecs_per_table, get_codec, is_qcomms, validate_codec_choice
from dlrmtrain.comm.sequence.layout import sequence_layout_of
from dlrmtrain.comm.sequence.planner import SequencePlanner
from dlrmtrain.comm.stats import CountsCommBytes

logger = logging.getLogger(__name__)

DEDUP_SHARDING_TYPES = ("table_wise", "row_wise")
"""sequence shardings `dedup` carries; column-wise sequence tables keep the stock dist (logged)"""


def layout_entries(layout: Layout | None) -> list:
    """Every feature entry of a wire layout (none without one)."""
    if layout is None:
        return []
    return layout.all_entries() if isinstance(layout, DistLayout) else list(layout.entries)


class CodecShardedEmbeddingCollection(hooks.IdRecordingShardedEC):
    """TorchRec's sharded EC with dedup sequence dists where the table codecs ask for them."""

    def __init__(self, *args: Any, table_codecs: Mapping[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # the codec dists installed below (`stats.COUNTERS_ATTR`)
        self.comm_counters: list[CountsCommBytes] = []
        env = hooks.sharding_env(self)
        rank = dist.get_rank(env.process_group)
        for i, (sharding_type, sharding) in enumerate(hooks.ec_shardings(self)):
            layout = layout_for(sharding_type, sharding, env.world_size)
            tables = sorted({e.table for e in layout_entries(layout)})
            names = sorted({table_codecs[t] for t in tables})
            if not any(isinstance(get_codec(n), DedupCodec) for n in names):
                continue  # none / TorchRec's qcomms: the stock dist
            if len(names) > 1:
                raise ValueError(f"comm.table_codecs: {sharding_type} sequence tables {tables} share one "
                                 f"all-to-all but ask for codecs {names}; give them one codec")
            codec = get_codec(names[0])
            if sharding_type not in DEDUP_SHARDING_TYPES:
                logger.warning("comm codec %r does not carry %s sequence embeddings; tables %s use codec none",
                               codec.name, sharding_type, tables)
                continue
            stock = hooks.output_dists(self)[i]
            planner = SequencePlanner(sequence_layout_of(layout, rank), rank)
            new_dist = DedupDist(stock, planner, env.process_group, sharding_type,
                                 {t: codec.name for t in tables}, codec.wire_dtype, codec.name)
            hooks.replace_output_dist(self, i, new_dist)
            self.comm_counters.append(new_dist)
            logger.info("comm codec %r%s carries %s sequence tables %s", codec.name,
                        "" if codec.lossless else " (LOSSY)", sharding_type, tables)


class CodecEmbeddingCollectionSharder(EmbeddingCollectionSharder):
    """`EmbeddingCollectionSharder` whose sharded module carries codec dists."""

    def __init__(self, codec: str, table_codecs: Mapping[str, str],
                 fused_params: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(fused_params=fused_params, **kwargs)
        self._codec = codec
        self._table_codecs = dict(table_codecs)

    def shard(self, module: EmbeddingCollection, params, env: ShardingEnv,
              device: torch.device | None = None, module_fqn: str | None = None):
        tables = [c.name for c in module.embedding_configs()]
        return hooks.build_sharded_ec(
            CodecShardedEmbeddingCollection, self, module, params, env, device, module_fqn,
            table_codecs=codecs_per_table(self._codec, self._table_codecs, tables))

    @property
    def sharded_module_type(self):
        return CodecShardedEmbeddingCollection


def make_ec_sharder(codec: str, table_codecs: dict[str, str], fused_params: dict,
                    device_type: str = "cpu") -> ModuleSharder:
    """The EmbeddingCollection sharder for a run: TorchRec's own for `none` everywhere, else ours.

    Same arguments as `make_ebc_sharder` (comm/sharder.py). `auto` does not yet
    carry sequence embeddings (a clear error); lossy names are logged as LOSSY.
    """
    validate_codec_choice(codec, table_codecs, device_type)
    names = {codec, *table_codecs.values()}
    if "auto" in names:
        raise ValueError("comm.codec: 'auto' does not yet carry sequence embeddings (EmbeddingCollection); "
                         "use 'dedup' (lossless) or 'none'")
    if names == {"none"}:
        return EmbeddingCollectionSharder(fused_params=fused_params)
    lossy = sorted(n for n in names if not get_codec(n).lossless)
    if lossy:
        logger.warning("comm codec %s is LOSSY: sequence embeddings and their gradients are rounded on the "
                       "wire, so training differs from comm.codec=none", ", ".join(lossy))
    registry = get_codec(codec).qcomm_codecs_registry(device_type) if is_qcomms(codec) else None
    return CodecEmbeddingCollectionSharder(codec, table_codecs, fused_params=fused_params,
                                           qcomm_codecs_registry=registry)
