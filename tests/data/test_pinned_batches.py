"""Batches bound for a GPU are built in pinned memory, on the prefetch thread (issue 26):
a copy from pageable memory is synchronous whatever `non_blocking` says. Pinning needs
CUDA, so on CPU the decision (a function of the device) is checked, and the pin path is
followed with `pin_memory` stood in for; the real copy is checked where CUDA is present."""

from __future__ import annotations

import threading

import pytest
import torch
from torchrec.datasets.utils import Batch

from dlrmtrain.config import load_config
from dlrmtrain.workloads import build_datasets
from dlrmtrain.data.loader import PooledBatch, pins_for
from dlrmtrain.sequence_features import SequenceBatch
from tests.common import TINY
from tests.multiproc.test_dlrmv4 import MINI, TINY as TINY_V4


def test_only_a_cuda_device_pins():
    assert pins_for(torch.device("cuda", 1)) and pins_for("cuda")
    assert not pins_for(torch.device("cpu"))


@pytest.fixture
def pinned(monkeypatch) -> list[tuple[str, str, int]]:
    """(what, thread, id) for every pin_memory call; each returns its argument unchanged."""
    calls: list[tuple[str, str, int]] = []

    def stand_in(what):
        def pin(self):
            calls.append((what, threading.current_thread().name, id(self)))
            return self
        return pin

    monkeypatch.setattr(Batch, "pin_memory", stand_in("batch"))
    monkeypatch.setattr(PooledBatch, "pin_memory", stand_in("batch"))  # the row loader's batch
    monkeypatch.setattr(SequenceBatch, "pin_memory", stand_in("batch"))
    monkeypatch.setattr(torch.Tensor, "pin_memory", stand_in("weights"))
    return calls


@pytest.mark.parametrize("config, overrides, thread", [
    (None, [*TINY, "data.source=synthetic"], "MainThread"),  # in memory: built where it is read
    (MINI, [*TINY_V4, "data.yambda.prefetch_batches=2"], "yambda-prefetch"),
])
def test_a_gpu_runs_batches_are_pinned_where_they_are_built(pinned, tmp_path, config, overrides, thread):
    cfg = load_config(config, [*overrides, f"run.output_dir={tmp_path}"])
    data = build_datasets(cfg, 0, 2, pin_memory=True)
    batches = [b for _, b in zip(range(3), data.train_batches(0, 0))]
    evals = [e for _, e in zip(range(1), data.eval_batches())]
    assert len(batches) == 3 and len(evals) == 1
    pinned_ids = {i for _, _, i in pinned}
    assert all(id(b) in pinned_ids for b in batches)  # every batch yielded went through the pin
    assert all(id(b) in pinned_ids and id(w) in pinned_ids for b, w in evals)
    assert {t for _, t, _ in pinned} == {thread}
    pinned.clear()
    unpinned = build_datasets(cfg, 0, 2, pin_memory=False)
    next(iter(unpinned.train_batches(0, 0)))
    assert pinned == []  # a CPU run pins nothing


def test_the_criteo_loader_pins_on_its_prefetch_thread(pinned, tmp_path):
    from dlrmtrain.data.loader import CriteoBatchLoader, CriteoLoaderSpec
    from dlrmtrain.data.sources import open_parts
    from tests.data.test_loader import make_indexed_dataset

    make_indexed_dataset(tmp_path)
    loader = CriteoBatchLoader(open_parts(tmp_path), CriteoLoaderSpec(8, last_batch="pad", prefetch=2, pin_memory=True))
    batches = list(loader.iter_weighted())
    assert len(batches) == len(loader)
    pinned_ids = {i for _, _, i in pinned}
    assert all(id(b) in pinned_ids and id(w) in pinned_ids for b, w in batches)
    assert {t for _, t, _ in pinned} == {"batch-prefetch"} and len(pinned) == 2 * len(loader)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
def test_a_pinned_batch_is_copied_without_blocking(tmp_path):
    cfg = load_config(None, [*TINY, f"run.output_dir={tmp_path}"])
    data = build_datasets(cfg, 0, 1, pin_memory=pins_for(torch.device("cuda")))
    batch = next(iter(data.train_batches(0, 0)))
    assert batch.dense_features.is_pinned() and batch.sparse_features.values().is_pinned()
    on_gpu = batch.to(torch.device("cuda"), non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(on_gpu.dense_features.cpu(), batch.dense_features)


def test_a_sequence_batch_moves_its_values_once_and_its_parts_stay_views_of_them():
    """`uih` and `candidates` are views of `sparse`: a device copy or a pin moves `sparse` (and
    `distinct_sparse`) once and takes the parts as views of the moved values again, with their
    per-key lengths (no host sync to split them on a device)."""
    from tests.models.hstu_batches import make_batch

    batch = make_batch([[(1, 2, 3, 1, 100), (4, 5, 6, 0, 200)], [(7, 8, 9, 1, 300)]],
                       [(10, 11, 12, 1, 400), (13, 14, 15, 0, 500)], users=[5, 6])
    batch.distinct_sparse = batch.sparse
    moves = []

    def copy(kjt):  # a device copy's stand-in: new storage
        moves.append(kjt)
        return type(kjt)(
            keys=kjt.keys(), values=kjt.values().clone(), lengths=kjt.lengths().clone(),
            stride=kjt.stride(), length_per_key=kjt.length_per_key())

    moved = batch.moved(copy)
    assert [id(k) for k in moves] == [id(batch.sparse)] * 2  # sparse and distinct_sparse, not the parts
    storage = moved.sparse.values().untyped_storage().data_ptr()
    assert storage != batch.sparse.values().untyped_storage().data_ptr()
    for part, before in ((moved.uih, batch.uih), (moved.candidates, batch.candidates)):
        assert part.values().untyped_storage().data_ptr() == storage
        assert part.keys() == before.keys() and part.length_per_key() == before.length_per_key()
        assert torch.equal(part.values(), before.values()) and torch.equal(part.lengths(), before.lengths())
    assert torch.equal(moved.labels(), batch.labels())
    # `to` is such a move: on another device the parts are views of the moved sparse values
    meta = batch.to(torch.device("meta"))
    assert meta.uih.values()._base is meta.sparse.values() and meta.candidates.values()._base is meta.sparse.values()
    # sparse holding something else (dedup at the source: the distinct ids): each KJT moves
    moves.clear()
    distinct_form = SequenceBatch(batch.uih, batch.candidates, copy(batch.sparse))
    moves.clear()
    other = distinct_form.moved(copy)
    assert [id(k) for k in moves] == [id(batch.uih), id(batch.candidates), id(distinct_form.sparse)]
    assert torch.equal(other.uih.values(), batch.uih.values())


def test_a_pinned_sequence_batch_pins_each_kjt_by_its_own_method(monkeypatch):
    """`distinct_sparse` may be a KJT subclass whose `pin_memory` pins more (DistinctIdsKJT: its
    expansion): the batch's pin calls each KJT's own method, not KeyedJaggedTensor's."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from tests.models.hstu_batches import make_batch

    calls = []

    class OwnPin(KeyedJaggedTensor):
        def pin_memory(self):
            calls.append("own")
            return self

    monkeypatch.setattr(KeyedJaggedTensor, "pin_memory", lambda self: self)  # pinning needs CUDA
    batch = make_batch([[(1, 2, 3, 1, 100)]], [(10, 11, 12, 1, 400)], users=[5])
    sparse = batch.sparse
    batch.distinct_sparse = OwnPin(keys=sparse.keys(), values=sparse.values(), lengths=sparse.lengths())
    pinned = batch.pin_memory()
    assert calls == ["own"] and pinned.distinct_sparse is batch.distinct_sparse
