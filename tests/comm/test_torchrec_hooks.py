"""The one door to TorchRec's internals (comm/torchrec/): version check, mirrored signatures, no other door."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torchrec
from torchrec.distributed.embedding import EmbeddingCollectionSharder, ShardedEmbeddingCollection
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder, ShardedEmbeddingBagCollection
from torchrec.distributed.sharding.sequence_sharding import SequenceShardingContext

from dlrmtrain.comm import torchrec as door
from dlrmtrain.comm.torchrec import pipelines, sharder

COMM = Path(__file__).resolve().parents[2] / "dlrmtrain" / "comm"

# TorchRec (and torch) private names the codec layer relies on; comm/torchrec/ alone may spell them
PRIVATE_NAMES = {"_output_dists", "_create_input_dist", "_input_dists", "_grouped_embedding_configs",
                 "_grouped_embedding_configs_per_rank", "_callbacks", "_codecs", "_is_weighted", "_env",
                 "_embedding_shardings", "_sharding_types", "_sharded_module_order_overwrite",
                 "_storage_Use_Count", "_C", "_dist", "_cdata", "_pipelined_modules", "_stream_context",
                 "_data_dist_stream", "_pg", "_embedding_dims", "_qcomm_codecs_registry"}


def test_installed_torchrec_is_the_supported_one():
    assert torchrec.__version__.split("+")[0] == door.SUPPORTED_TORCHREC


def test_another_torchrec_version_fails_clearly():
    with pytest.raises(ImportError, match=r"TorchRec 1\.8\.0 internals, but TorchRec 1\.9\.0 is installed"):
        door.check_torchrec_version("1.9.0")
    door.check_torchrec_version("1.8.0+cpu")  # a local build tag is the same release


# kind: TorchRec's sharder and sharded module, and the signatures comm/torchrec/sharder.py recorded of them
MIRRORED = {
    "pooled": (EmbeddingBagCollectionSharder, ShardedEmbeddingBagCollection, sharder.SHARD_SIGNATURE,
               sharder.SHARDED_EBC_PARAMETERS),
    "sequence": (EmbeddingCollectionSharder, ShardedEmbeddingCollection, sharder.EC_SHARD_SIGNATURE,
                 sharder.SHARDED_EC_PARAMETERS),
}


@pytest.mark.parametrize("kind", list(MIRRORED))
def test_shard_call_mirrors_torchrec_signatures(kind):
    """`build_sharded` repeats TorchRec's `shard()` call: an added argument must not be dropped."""
    stock_sharder, sharded_module, shard_signature, sharded_parameters = MIRRORED[kind]
    assert str(inspect.signature(stock_sharder.shard)) == shard_signature
    params = tuple(inspect.signature(sharded_module.__init__).parameters)
    assert params == sharded_parameters
    passed = {kw.arg for node in ast.walk(ast.parse(inspect.getsource(sharder.build_sharded)))
              if isinstance(node, ast.Call) for kw in node.keywords if kw.arg}
    assert set(params) - {"self"} <= passed


def test_overridden_torchrec_methods_still_exist():
    for name in ("_create_input_dist", "input_dist", "compute", "compute_and_output_dist"):
        assert callable(getattr(ShardedEmbeddingBagCollection, name)), name
    assert "input_feature_names" in inspect.signature(ShardedEmbeddingBagCollection._create_input_dist).parameters


def test_overridden_ec_methods_and_context_fields_still_exist():
    for name in ("input_dist", "compute", "compute_and_output_dist"):
        assert callable(getattr(ShardedEmbeddingCollection, name)), name
    # the sample end's ids: TorchRec's own record of the KJT before the id all-to-all
    assert "features_before_input_dist" in SequenceShardingContext.__dataclass_fields__


def test_fused_pipeline_internals_keep_their_shape():
    """StreamlessFusedSparseDist (run.pipeline: fused_sparse_dist) overrides and calls these."""
    from torchrec.distributed.train_pipeline import TrainPipelineFusedSparseDist
    from torchrec.distributed.train_pipeline.pipeline_context import EmbeddingTrainPipelineContext
    from torchrec.distributed.train_pipeline.utils import _start_embedding_lookup

    assert tuple(inspect.signature(_start_embedding_lookup).parameters) == (
        "module", "context", "source_stream", "target_stream", "stream_context")
    assert tuple(inspect.signature(TrainPipelineFusedSparseDist.start_embedding_lookup).parameters) == (
        "self", "batch", "context")
    assert "start_embedding_lookup" in inspect.getsource(TrainPipelineFusedSparseDist.progress)
    context = EmbeddingTrainPipelineContext()
    assert isinstance(context.module_contexts, dict) and isinstance(context.embedding_a2a_requests, dict)
    assert issubclass(pipelines.StreamlessFusedSparseDist, TrainPipelineFusedSparseDist)


def test_pipeline_methods_planning_ahead_relies_on_still_exist():
    """`PlanAheadPipeline` plans in `dequeue_batch`, which `progress` must still call last, and
    re-homes plans in `attach`; it reads each context's tensors requests and module contexts."""
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
    from torchrec.distributed.train_pipeline.pipeline_context import TrainPipelineContext

    assert inspect.getsource(TrainPipelineSparseDist.progress).rstrip().endswith(
        "self.dequeue_batch()\n        return output")
    assert list(inspect.signature(TrainPipelineSparseDist.attach).parameters) == ["self", "model", "sparse_dist"]
    assert callable(TrainPipelineSparseDist.dequeue_batch)
    fields = TrainPipelineContext.__dataclass_fields__
    assert {"input_dist_tensors_requests", "module_contexts"} <= set(fields)


def test_row_wise_variable_batch_internals_keep_their_shape():
    """`row_wise_dists_for_source` (row-wise tables at the source) rebuilds TorchRec's row-wise
    output dist from its attributes and repeats its forward for both batch kinds; over Gloo it
    replaces the request's wait function, whose backward is the uneven all-gather."""
    from torchrec.distributed.comm_ops import ReduceScatterV_Req, ReduceScatterV_Wait
    from torchrec.distributed.dist_data import PooledEmbeddingsReduceScatter, VariableBatchPooledEmbeddingsReduceScatter
    from torchrec.distributed.sharding.rw_sharding import RwPooledEmbeddingDist

    assert list(inspect.signature(RwPooledEmbeddingDist.__init__).parameters) == [
        "self", "pg", "embedding_dims", "qcomm_codecs_registry"]
    forward = inspect.getsource(RwPooledEmbeddingDist.forward)
    for call in ("sharding_ctx.variable_batch_per_feature", "batch_size_per_rank_per_feature=sharding_ctx."
                 "batch_size_per_rank_per_feature", "embedding_dims=self._embedding_dims",
                 "input_splits=sharding_ctx.batch_size_per_rank"):
        assert call in forward, call
    for cls in (PooledEmbeddingsReduceScatter, VariableBatchPooledEmbeddingsReduceScatter):
        assert list(inspect.signature(cls.__init__).parameters) == ["self", "pg", "codecs"]
    assert "myreq.wait_function = ReduceScatterV_Wait" in inspect.getsource(ReduceScatterV_Req.forward)
    assert "dist.all_gather(" in inspect.getsource(ReduceScatterV_Wait.backward)
    assert "myreq.req.wait()" in inspect.getsource(ReduceScatterV_Req.backward)


def private_names_used(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    used |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return used & PRIVATE_NAMES


def test_private_names_only_in_the_hooks_module():
    offenders = {str(p.relative_to(COMM)): sorted(private_names_used(p)) for p in sorted(COMM.rglob("*.py"))
                 if p.relative_to(COMM).parts[0] != "torchrec" and private_names_used(p)}
    assert not offenders, f"TorchRec/torch internals outside comm/torchrec/: {offenders}"
    assert private_names_used(COMM / "torchrec" / "pooled.py")  # the scan sees them where they are
