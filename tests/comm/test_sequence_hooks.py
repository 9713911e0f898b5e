"""The EmbeddingCollection doors in comm/torchrec/: mirrored signatures, overridden methods."""

from __future__ import annotations

import ast
import inspect

from torchrec.distributed.embedding import EmbeddingCollectionSharder, ShardedEmbeddingCollection
from torchrec.distributed.sharding.sequence_sharding import SequenceShardingContext

from dlrmtrain.comm.torchrec import sharder


def test_ec_shard_call_mirrors_torchrec_signatures():
    """`build_sharded` repeats TorchRec's `shard()` call: an added argument must not be dropped."""
    assert str(inspect.signature(EmbeddingCollectionSharder.shard)) == sharder.EC_SHARD_SIGNATURE
    params = tuple(inspect.signature(ShardedEmbeddingCollection.__init__).parameters)
    assert params == sharder.SHARDED_EC_PARAMETERS
    passed = {kw.arg for node in ast.walk(ast.parse(inspect.getsource(sharder.build_sharded)))
              if isinstance(node, ast.Call) for kw in node.keywords if kw.arg}
    assert set(params) - {"self"} <= passed


def test_overridden_ec_methods_and_context_fields_still_exist():
    for name in ("input_dist", "compute", "compute_and_output_dist"):
        assert callable(getattr(ShardedEmbeddingCollection, name)), name
    # the sample end's ids: TorchRec's own record of the KJT before the id all-to-all
    assert "features_before_input_dist" in SequenceShardingContext.__dataclass_fields__


def test_ec_private_names_only_in_the_hooks_module():
    """The EC's private TorchRec names are spelled in comm/torchrec/ alone (as the EBC's are)."""
    from pathlib import Path

    comm = Path(sharder.__file__).parents[1]
    private = {"_sharding_type_to_sharding", "_use_index_dedup", "_sharding_types", "_output_dists",
               "_embedding_configs"}
    offenders = {}
    for path in sorted(comm.rglob("*.py")):
        tree = ast.parse(path.read_text())
        used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} & private
        if used and "torchrec" not in path.relative_to(comm).parts[:1]:
            offenders[str(path.relative_to(comm))] = sorted(used)
    assert not offenders, f"TorchRec EC internals outside comm/torchrec/: {offenders}"
