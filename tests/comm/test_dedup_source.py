"""The source-side plan (comm/dedup/source.py) on hand-made KJTs: every sample's bag comes
back through the inverse, only distinct bags are kept, and the edge cases hold."""

from __future__ import annotations

import pytest
import torch
from torchrec import KeyedJaggedTensor

from dlrmtrain.comm.dedup.source import distinct_bags


def kjt_of(bags: dict[str, list[list[int]]], lengths_dtype=torch.int32) -> KeyedJaggedTensor:
    keys = list(bags)
    return KeyedJaggedTensor(
        keys=keys, values=torch.tensor([i for k in keys for b in bags[k] for i in b], dtype=torch.int64),
        lengths=torch.tensor([len(b) for k in keys for b in bags[k]], dtype=lengths_dtype),
        stride=len(bags[keys[0]]))


def recovered(vbe: KeyedJaggedTensor, kept: tuple[str, ...] = ()) -> dict[str, list[list[int]]]:
    """Each sample's bag, read back through the inverse indices (features not `kept` hold each bag once)."""
    keys, inverse = vbe.inverse_indices()
    assert keys == vbe.keys()
    out = {}
    for f, key in enumerate(keys):
        jt = vbe[key]
        distinct = [jt.values()[s:e].tolist() for s, e in zip(jt.offsets()[:-1].tolist(), jt.offsets()[1:].tolist())]
        assert len(distinct) == vbe.stride_per_key_per_rank()[f][0]
        if key not in kept:
            assert len({tuple(b) for b in distinct}) == len(distinct), f"{key}: a bag kept twice"
        out[key] = [distinct[i] for i in inverse[f].tolist()]
    return out


CASES = {
    "one_hot": {"a": [[3], [1], [3], [3], [0]], "b": [[7], [7], [2], [9], [2]]},
    "missing": {"a": [[3], [], [3], [], [5]], "b": [[], [], [], [], []]},  # b: an empty feature
    "all_same": {"a": [[4]] * 5, "b": [[4]] * 5},
    "multi_hot": {"a": [[1, 2], [2, 1], [1, 2], [1], [1, 2, 0]], "b": [[5, 5, 5], [5, 5, 5], [5], [], [5, 5]]},
    "prefix": {"a": [[0], [0, 0], [], [0, 0], [0]]},  # zero ids and zero padding never collide
    "negative_and_large": {"a": [[-3], [2 ** 40], [-3], [0], [2 ** 40]]},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_bag_comes_back_through_the_inverse(name):
    bags = CASES[name]
    vbe = distinct_bags(kjt_of(bags))
    assert recovered(vbe) == bags
    for f, key in enumerate(vbe.keys()):
        assert vbe.stride_per_key_per_rank()[f] == [len({tuple(b) for b in bags[key]})]
    assert vbe.lengths().dtype == torch.int32 and vbe.values().dtype == torch.int64


def test_all_the_same_ids_are_one_bag_and_an_empty_feature_one_empty_bag():
    vbe = distinct_bags(kjt_of(CASES["all_same"]))
    assert vbe.stride_per_key_per_rank() == [[1], [1]] and vbe.values().tolist() == [4, 4]
    empty = distinct_bags(kjt_of(CASES["missing"]))
    assert empty.stride_per_key_per_rank()[1] == [1] and empty["b"].lengths().tolist() == [0]


def test_kept_features_travel_whole():
    bags = CASES["multi_hot"]
    vbe = distinct_bags(kjt_of(bags), keep={"b"})
    assert vbe.stride_per_key_per_rank() == [[4], [5]]
    assert vbe.inverse_indices()[1][1].tolist() == list(range(5))
    assert recovered(vbe, kept=("b",)) == bags


def test_a_rank_with_no_samples():
    kjt = KeyedJaggedTensor(keys=["a", "b"], values=torch.zeros(0, dtype=torch.int64),
                            lengths=torch.zeros(0, dtype=torch.int32), stride=0)
    vbe = distinct_bags(kjt)
    assert vbe.stride_per_key_per_rank() == [[0], [0]]
    assert vbe.inverse_indices()[1].shape == (2, 0)


def test_weighted_and_variable_batch_inputs_are_refused():
    weighted = KeyedJaggedTensor(keys=["a"], values=torch.tensor([1, 2]), lengths=torch.tensor([1, 1]),
                                 weights=torch.tensor([0.5, 1.0]), stride=2)
    with pytest.raises(ValueError, match="comm.dedup_at: source: weighted"):
        distinct_bags(weighted)
    with pytest.raises(ValueError, match="already variable-batch"):
        distinct_bags(distinct_bags(kjt_of(CASES["one_hot"])))


SOURCE = ["comm.codec=dedup", "comm.dedup_at=source", "optim.name=sgd", "run.pipeline=off"]


@pytest.mark.parametrize("overrides, message", [
    (["comm.codec=none"], "comm.dedup_at: source needs comm.codec: dedup"),
    (["comm.codec=dedup+fp16"], "comm.dedup_at: source needs comm.codec: dedup"),
    (["comm.table_codecs={t_cat_3: auto}"], "comm.table_codecs.t_cat_3: 'auto' cannot run under comm.dedup_at"),
    (["comm.hierarchy=node", "comm.ranks_per_node=1"], "comm.hierarchy: node takes comm.dedup_at: owner"),
    (["optim.name=adagrad"], "EXACT_ADAGRAD"),
])
def test_source_is_refused_where_it_is_not_built(tmp_path, overrides, message):
    from dlrmtrain.config import ConfigError
    from dlrmtrain.validation import validate_config
    from tests.common import tiny_config

    validate_config(tiny_config(str(tmp_path), *SOURCE, "comm.table_codecs={t_cat_3: none}"), 2)
    for pipeline in ("sparse_dist", "fused_sparse_dist"):  # tests/multiproc/test_pipelines.py trains them
        validate_config(tiny_config(str(tmp_path), *SOURCE, f"run.pipeline={pipeline}"), 2)
        validate_config(tiny_config(str(tmp_path), *SOURCE, "comm.codec=auto", f"run.pipeline={pipeline}"), 2)
    validate_config(tiny_config(str(tmp_path), *SOURCE, "comm.codec=auto"), 2)
    with pytest.raises(ConfigError, match=message):
        validate_config(tiny_config(str(tmp_path), *SOURCE, *overrides), 2)


def test_sequence_embeddings_take_source_through_their_own_check(tmp_path):
    """DLRMv4's EC dedups at the source through the loader's distinct ids: the pooled refusals
    (no Adagrad) are not its; its own (comm/embedding.py) still apply."""
    from dlrmtrain.config import ConfigError, load_config
    from dlrmtrain.validation import validate_config

    base = [f"run.output_dir={tmp_path}", "comm.codec=dedup", "comm.dedup_at=source"]
    validate_config(load_config("configs/mini_dlrmv4.yaml", base + ["run.pipeline=sparse_dist"]), 2)
    validate_config(load_config("configs/mini_dlrmv4.yaml", base + ["comm.codec=auto", "run.pipeline=sparse_dist"]), 2)
    with pytest.raises(ConfigError, match="comm.dedup_at: source needs comm.codec: dedup or auto"):
        validate_config(load_config("configs/mini_dlrmv4.yaml", base + ["comm.codec=dedup+fp16"]), 2)


def test_a_pipelines_copy_keeps_the_inverse_and_records_its_stream(monkeypatch):
    """TorchRec's pipelines move the batch (`to`) and record it on the stream that reads it:
    the variable-batch KJT's inverse indices go along both times. `KeyedJaggedTensor.record_stream`
    leaves them out, so on CUDA the allocator could hand their memory to the next batch's copy
    while the expansion still reads it."""
    import dataclasses

    import numpy as np

    from dlrmtrain.data.loader import PooledBatch, block_to_batch
    from dlrmtrain.data.parts import RowBlock

    sparse = np.arange(4 * 26, dtype=np.int64).reshape(4, 26) % 3
    batch = block_to_batch(RowBlock(np.zeros((4, 13), np.float32), sparse, np.zeros(4, np.float32)))
    batch = dataclasses.replace(batch, sparse_features=distinct_bags(batch.sparse_features))
    moved = batch.to(torch.device("cpu"), non_blocking=True)
    assert isinstance(moved, PooledBatch)
    inverse = moved.sparse_features.inverse_indices()[1]
    assert torch.equal(inverse, batch.sparse_features.inverse_indices()[1])
    recorded: list[torch.Tensor] = []
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, stream: recorded.append(t))
    moved.record_stream(object())  # CPU memory has no streams: the calls are what is checked
    assert any(t is inverse for t in recorded)
    assert any(t is moved.sparse_features.values() for t in recorded)
