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
from torchrec.distributed.types import ModuleSharder

from dlrmtrain.comm.torchrec import pooled
from dlrmtrain.comm.install import CodecSharder
from dlrmtrain.comm.stats import CommCounters
from dlrmtrain.comm.topology import FLAT, Hierarchy
from dlrmtrain.config.schema import AutoConfig


class CodecEmbeddingBagCollectionSharder(CodecSharder, EmbeddingBagCollectionSharder):
    """`EmbeddingBagCollectionSharder` whose sharded module (the id-recording EBC) carries codec dists."""

    sharded_type = pooled.IdRecordingShardedEBC
    kind = "pooled"
    shardings_of = staticmethod(pooled.shardings)
    stock_type = EmbeddingBagCollectionSharder


def make_ebc_sharder(codec: str, table_codecs: dict[str, str], fused_params: dict,
                     device_type: str = "cpu", hierarchy: Hierarchy = FLAT,
                     auto: AutoConfig | None = None, counters: CommCounters | None = None) -> ModuleSharder:
    """The EBC sharder for a run: stock TorchRec for `none` everywhere, else ours.

    `codec` is the run's `comm.codec`; `table_codecs` per-table overrides keyed
    by table name; `fused_params` go to the fused embedding optimizer as usual;
    `device_type` ("cpu" / "cuda") picks TorchRec's qcomms kernels for the lossy
    codecs (`fp8` is refused off GPU); `hierarchy` (comm.hierarchy, comm.ranks_per_node)
    makes `dedup` two-level across nodes; `auto` (comm.auto; None: the defaults) sets every
    `auto` dist's policy; the codec dists are added to `counters` (the run's; None: the sharder's
    own, `sharder.counters`).
    """
    return CodecEmbeddingBagCollectionSharder.for_codecs(codec, table_codecs, fused_params, device_type, hierarchy,
                                                         auto, counters)
