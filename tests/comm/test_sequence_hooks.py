"""The EmbeddingCollection doors in torchrec_hooks.py: mirrored signatures, overridden methods."""

from __future__ import annotations

import ast
import inspect

from torchrec.distributed.embedding import EmbeddingCollectionSharder, ShardedEmbeddingCollection
from torchrec.distributed.sharding.sequence_sharding import SequenceShardingContext

from dlrmtrain.comm import torchrec_hooks as hooks


def test_ec_shard_call_mirrors_torchrec_signatures():
    """`build_sharded_ec` repeats TorchRec's `shard()` call: an added argument must not be dropped."""
    assert str(inspect.signature(EmbeddingCollectionSharder.shard)) == hooks.EC_SHARD_SIGNATURE
    params = tuple(inspect.signature(ShardedEmbeddingCollection.__init__).parameters)
    assert params == hooks.SHARDED_EC_PARAMETERS
    passed = {kw.arg for node in ast.walk(ast.parse(inspect.getsource(hooks.build_sharded_ec)))
              if isinstance(node, ast.Call) for kw in node.keywords if kw.arg}
    assert set(params) - {"self"} <= passed


def test_overridden_ec_methods_and_context_fields_still_exist():
    for name in ("input_dist", "compute", "compute_and_output_dist"):
        assert callable(getattr(ShardedEmbeddingCollection, name)), name
    # the sample end's ids: TorchRec's own record of the KJT before the id all-to-all
    assert "features_before_input_dist" in SequenceShardingContext.__dataclass_fields__
