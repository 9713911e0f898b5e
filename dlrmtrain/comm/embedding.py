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

Dedup where the batch is made (comm/placement.py's sample side) needs no dist of ours: the
loader's prefetch thread replaces each table's ids by its distinct ones
(dedup/sequence_source.py, with its sharder), the stock dists send them and TorchRec's expand
(the one its index dedup uses) gives the rows back per position
(`torchrec.sequence.SourceDedupShardedEC`).
"""

from __future__ import annotations

from torchrec.distributed.embedding import EmbeddingCollectionSharder

from dlrmtrain.comm.install import CodecSharder
from dlrmtrain.comm.torchrec import sequence


class CodecEmbeddingCollectionSharder(CodecSharder, EmbeddingCollectionSharder):
    """`EmbeddingCollectionSharder` whose sharded module (the id-recording EC) carries codec dists."""

    sharded_type = sequence.IdRecordingShardedEC
    kind = "sequence"
    shardings_of = staticmethod(sequence.ec_shardings)
    stock_type = EmbeddingCollectionSharder
