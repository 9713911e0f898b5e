"""The EmbeddingBagCollection sharder that installs codecs on TorchRec's output dists.

TorchRec's `ShardedEmbeddingBagCollection` builds one output dist per sharding
type; ours asks each sharding's codec for its dist (install.py), after TorchRec
has built them. The ids both ends of each all-to-all hold are recorded into the
sharding contexts by `IdRecordingShardedEBC`; every TorchRec internal this needs
is reached through comm/torchrec/ (comm/README.md, "TorchRec hook points").
Everything else (lookups, fused optimizer, state dict) is TorchRec's.
"""

from __future__ import annotations

from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

from dlrmtrain.comm.torchrec import pooled
from dlrmtrain.comm.install import CodecSharder


class CodecEmbeddingBagCollectionSharder(CodecSharder, EmbeddingBagCollectionSharder):
    """`EmbeddingBagCollectionSharder` whose sharded module (the id-recording EBC) carries codec dists."""

    sharded_type = pooled.IdRecordingShardedEBC
    kind = "pooled"
    shardings_of = staticmethod(pooled.shardings)
    stock_type = EmbeddingBagCollectionSharder
