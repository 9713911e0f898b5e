"""The EmbeddingBagCollection sharder that installs codecs on TorchRec's output dists.

TorchRec's `ShardedEmbeddingBagCollection` builds one output dist per sharding
type; ours asks each sharding's codec for its dist (install.py), after TorchRec
has built them. The ids both ends of each all-to-all hold are recorded into the
sharding contexts by `IdRecordingShardedEBC`; every TorchRec internal this needs
is reached through comm/torchrec/ (comm/README.md, "TorchRec hook points").
Everything else (lookups, fused optimizer, state dict) is TorchRec's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.types import ModuleSharder

from dlrmtrain.comm.torchrec import pooled
from dlrmtrain.comm.codec import EmbeddingCommCodec
from dlrmtrain.comm.install import CodecSharder, codec_choice, install_codec_dists
from dlrmtrain.comm.stats import CountsCommBytes
from dlrmtrain.comm.topology import FLAT, Hierarchy
from dlrmtrain.config.schema import AutoConfig


class CodecShardedEmbeddingBagCollection(pooled.IdRecordingShardedEBC):
    """TorchRec's sharded EBC with codec output dists where the plan asks for them."""

    def __init__(self, *args: Any, table_codecs: Mapping[str, EmbeddingCommCodec],
                 hierarchy: Hierarchy = FLAT, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # the codec dists (`stats.COUNTERS_ATTR`; count_stock_dists appends none's counters)
        self.comm_counters: list[CountsCommBytes] = install_codec_dists(
            self, pooled.shardings(self), table_codecs, hierarchy, "pooled", kwargs.get("device"))


class CodecEmbeddingBagCollectionSharder(CodecSharder, EmbeddingBagCollectionSharder):
    """`EmbeddingBagCollectionSharder` whose sharded module carries codec dists."""

    sharded_type = CodecShardedEmbeddingBagCollection


def make_ebc_sharder(codec: str, table_codecs: dict[str, str], fused_params: dict,
                     device_type: str = "cpu", hierarchy: Hierarchy = FLAT,
                     auto: AutoConfig | None = None) -> ModuleSharder:
    """The EBC sharder for a run: stock TorchRec for `none` everywhere, else ours.

    `codec` is the run's `comm.codec`; `table_codecs` per-table overrides keyed
    by table name; `fused_params` go to the fused embedding optimizer as usual;
    `device_type` ("cpu" / "cuda") picks TorchRec's qcomms kernels for the lossy
    codecs (`fp8` is refused off GPU); `hierarchy` (comm.hierarchy, comm.ranks_per_node)
    makes `dedup` two-level across nodes; `auto` (comm.auto; None: the defaults) sets every
    `auto` dist's policy.
    """
    choice = codec_choice(codec, table_codecs, device_type, hierarchy, "pooled", auto)
    if choice is None:
        return EmbeddingBagCollectionSharder(fused_params=fused_params)
    return CodecEmbeddingBagCollectionSharder(choice, fused_params=fused_params)
