"""The EmbeddingCollection sharder that installs codecs on TorchRec's sequence-embedding dists.

The sequence counterpart of embeddingbag.py's EBC sharder: TorchRec's
`ShardedEmbeddingCollection` builds one sequence output dist per sharding type
(`TwSequenceEmbeddingDist`, `RwSequenceEmbeddingDist`, both around
`SequenceEmbeddingsAllToAll`); ours asks each sharding's codec for its dist
(install.py) after TorchRec built them: `dedup` a `DedupDist` run by a
`SequencePlanner` (dedup/sequence.py), `auto` a `SequenceAutoDist` (auto/sequence.py); `none`
and TorchRec's lossy qcomms (`fp16`, `bf16`, `int8`, quantizing inside the stock
dist through the sharder's `qcomm_codecs_registry`) keep the stock dist. Both
ends' ids are recorded by `IdRecordingShardedEC` (torchrec/sequence.py). Lookups,
the fused optimizer and the state dict stay TorchRec's.

`comm.dedup_at: source` (`dedup` only) needs no dist of ours: the loader's prefetch thread
replaces each table's ids by its distinct ones (dedup/sequence_source.py), the stock dists
send them and TorchRec's expand (the one its index dedup uses) gives the rows back per
position (`torchrec.sequence.SourceDedupShardedEC`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.types import ModuleSharder, ShardingEnv
from torchrec.modules.embedding_modules import EmbeddingCollection

from dlrmtrain.comm.torchrec import sequence, sharder
from dlrmtrain.comm.install import CodecSharder, codec_choice
from dlrmtrain.comm.registry import validate_dedup_at
from dlrmtrain.comm.stats import CommCounters
from dlrmtrain.comm.topology import FLAT, Hierarchy
from dlrmtrain.config.schema import AutoConfig


class CodecEmbeddingCollectionSharder(CodecSharder, EmbeddingCollectionSharder):
    """`EmbeddingCollectionSharder` whose sharded module (the id-recording EC) carries codec dists."""

    sharded_type = sequence.IdRecordingShardedEC
    kind = "sequence"
    shardings_of = staticmethod(sequence.ec_shardings)


class SourceDedupEmbeddingCollectionSharder(EmbeddingCollectionSharder):
    """TorchRec's sharder building `SourceDedupShardedEC` (`comm.dedup_at: source`): the stock
    dists carry the distinct ids the loader made (dedup/sequence_source.py)."""

    def shard(self, module: EmbeddingCollection, params, env: ShardingEnv,
              device: torch.device | None = None, module_fqn: str | None = None):
        return sharder.build_sharded(sequence.SourceDedupShardedEC, self, module, params, env, device, module_fqn)

    @property
    def sharded_module_type(self):
        return sequence.SourceDedupShardedEC


def validate_sequence_dedup_at(dedup_at: str, codec: str, table_codecs: Mapping[str, str],
                               hierarchy: str) -> None:
    """`comm.dedup_at: source` on sequence embeddings is the loader's distinct ids: the lossless
    `dedup`, or `auto` choosing per step between them and the full batch (comm/auto/source.py),
    on every table of the EC alike, flat. What it does not build is refused, naming the key."""
    validate_dedup_at(dedup_at, codec, table_codecs, hierarchy, None, "sequence")


def make_ec_sharder(codec: str, table_codecs: dict[str, str], fused_params: dict,
                    device_type: str = "cpu", hierarchy: Hierarchy = FLAT,
                    dedup_at: str = "owner", auto: AutoConfig | None = None,
                    counters: CommCounters | None = None) -> ModuleSharder:
    """The EmbeddingCollection sharder for a run: TorchRec's own for `none` everywhere, TorchRec's
    taking the loader's distinct ids for `dedup` at the source, else ours.

    Same arguments as `make_ebc_sharder` (embeddingbag.py, `auto` included), plus `comm.dedup_at`;
    `comm.hierarchy: node` is refused (two levels carry pooled embeddings only).
    """
    validate_sequence_dedup_at(dedup_at, codec, table_codecs, hierarchy.kind)
    if dedup_at == "source":
        return SourceDedupEmbeddingCollectionSharder(fused_params=fused_params)
    choice = codec_choice(codec, table_codecs, device_type, hierarchy, "sequence", auto)
    if choice is None:
        return EmbeddingCollectionSharder(fused_params=fused_params)
    return CodecEmbeddingCollectionSharder(choice, CommCounters() if counters is None else counters,
                                           fused_params=fused_params)
