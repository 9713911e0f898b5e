"""Rank slices, last-batch policies, resumption and the SequenceBatch layout of the Yambda loaders."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dlrmtrain.config.schema import Config
from dlrmtrain.data.yambda import build_yambda_loaders
from dlrmtrain.data.yambda.batch import RECYCLED_VALUES, to_sequence_batch
from dlrmtrain.data.yambda.loader import SequenceBatchLoader, SequenceLoaderSpec
from dlrmtrain.data.yambda.synthetic import YambdaLikeGenerator, YambdaLikeProfile
from dlrmtrain.sequence_features import CANDIDATE_FEATURES, CONTEXTUAL_FEATURES, CROSS_SPECS, UIH_FEATURES

PROFILE = YambdaLikeProfile(num_users=30, num_artists=500, history_length=12, min_history_fraction=0.5,
                            anchors_per_user=4, eval_anchors_per_user=1, artists_per_user=8.0)
CROSSES = [(n, k, 997, s) for n, k, _r, s in CROSS_SPECS]


def tiny_cfg(**synthetic) -> Config:
    cfg = Config()
    cfg.data.source = "synthetic_yambda"
    for key, value in {**dict(num_users=30, num_artists=500, history_length=12, anchors_per_user=4,
                              eval_anchors_per_user=1, artists_per_user=8.0, min_history_fraction=0.5),
                       **synthetic}.items():
        setattr(cfg.data.yambda.synthetic, key, value)
    cfg.data.yambda.cross_rows = {n: 997 for n, *_ in CROSS_SPECS}
    return cfg


def kjt_equal(a, b) -> bool:
    return a.keys() == b.keys() and torch.equal(a.values(), b.values()) and torch.equal(a.lengths(), b.lengths())


def test_batches_from_k_are_the_tail_of_a_full_pass_on_every_rank():
    cfg = tiny_cfg()
    for rank in (0, 1):
        full = list(build_yambda_loaders(cfg.data, rank, 2, 16, 16).train.batches_from(0))
        assert len(full) == 120 // 16
        for k in (0, 3, len(full) - 1, len(full)):
            fresh = build_yambda_loaders(cfg.data, rank, 2, 16, 16).train   # a restarted process
            tail = list(fresh.batches_from(k))
            assert len(tail) == len(full) - k
            assert all(kjt_equal(x.sparse, y.sparse) for x, y in zip(tail, full[k:]))
    # the prefetch thread changes nothing
    cfg.data.yambda.prefetch_batches = 3
    ahead = list(build_yambda_loaders(cfg.data, 1, 2, 16, 16).train.batches_from(2))
    cfg.data.yambda.prefetch_batches = 0
    plain = list(build_yambda_loaders(cfg.data, 1, 2, 16, 16).train.batches_from(2))
    assert all(kjt_equal(x.sparse, y.sparse) for x, y in zip(ahead, plain)) and len(ahead) == len(plain)


@pytest.mark.parametrize("slicing", ["contiguous", "round_robin"])
def test_rank_slices_are_disjoint_and_cover_the_kept_samples(slicing):
    windows = [np.arange(0, 23), np.arange(100, 110)]                   # 23 and 10 samples
    for last_batch, world, gbs in (("drop", 2, 8), ("drop", 4, 8), ("pad", 3, 9), ("pad", 2, 8)):
        loaders = [SequenceBatchLoader(windows, lambda ids: ids, SequenceLoaderSpec(r, world, gbs, slicing, last_batch))
                   for r in range(world)]
        assert len({ld.num_batches for ld in loaders}) == 1
        seen: list[int] = []
        for ld in loaders:
            for p in range(ld.num_batches):
                ids, real = ld.rank_sample_ids(p)
                assert len(ids) == (gbs // world if last_batch == "drop" else len(ids))
                seen += ids[:real].tolist()
        if last_batch == "drop":   # per window: its full global batches only, as the reference
            want = list(range(0, 23 // gbs * gbs)) + list(range(100, 100 + 10 // gbs * gbs))
        else:                      # every sample exactly once
            want = list(range(23)) + list(range(100, 110))
        assert sorted(seen) == want, (last_batch, world, gbs)


def test_round_robin_is_the_references_strided_slice():
    ld = SequenceBatchLoader([np.arange(40)], lambda ids: ids, SequenceLoaderSpec(rank=1, world_size=4, global_batch_size=8,
                             slicing="round_robin"))
    # StreamingWindowSampler: rank r reads indices[r::W] in batches of 2
    assert [ld.rank_sample_ids(p)[0].tolist() for p in range(ld.num_batches)] == \
        np.arange(40)[1::4].reshape(-1, 2).tolist()


def test_eval_pads_with_weight_zero():
    cfg = tiny_cfg()
    counts = []
    for rank in (0, 1, 2):
        weighted = list(build_yambda_loaders(cfg.data, rank, 3, 12, 12).eval.iter_weighted())
        assert all(b.batch_size == len(w) for b, w in weighted)
        counts.append(sum(float(w.sum()) for _b, w in weighted))
    assert sum(counts) == 30                                            # 30 users x 1 eval anchor
    loaders = build_yambda_loaders(cfg.data, 0, 3, 12, 12)
    assert (loaders.eval.num_real_samples, loaders.train.num_real_samples) == (30, 120 // 12 * 12)


def test_the_batch_layout_is_the_contract():
    gen = YambdaLikeGenerator(PROFILE, CROSSES)
    ld = SequenceBatchLoader([np.arange(40)], gen.columns, SequenceLoaderSpec(0, 1, 8, "contiguous"))
    batch = next(ld.batches_from(1))
    cols = gen.columns(np.arange(8, 16))
    assert batch.uih.keys() == UIH_FEATURES and batch.candidates.keys() == CANDIDATE_FEATURES
    assert batch.sparse.keys() == UIH_FEATURES + CANDIDATE_FEATURES and batch.batch_size == 8
    for key in UIH_FEATURES:
        lengths = batch.uih[key].lengths().tolist()
        assert lengths == ([1] * 8 if key in CONTEXTUAL_FEATURES else cols.history_lengths.tolist()), key
    assert batch.uih["item_id"].values().tolist() == cols.history["item_id"].tolist()
    assert batch.uih["uid"].values().tolist() == cols.uid.tolist()
    assert batch.uih["user_x_artist"].values().tolist() == cols.crosses["user_x_artist"].tolist()
    assert batch.uih["dummy_watch_time"].values().abs().sum() == 0
    assert batch.candidates["item_dummy_watchtime"].values().tolist() == [1] * 8
    assert batch.labels().tolist() == (cols.candidate["item_action_weight"] == 1).astype(float).tolist()
    assert torch.equal(batch.sparse["item_candidate_id"].values(),
                       torch.from_numpy(cols.candidate["item_candidate_id"]))


def test_histories_written_in_place_make_the_batch_copies_make():
    cols = YambdaLikeGenerator(PROFILE, CROSSES).columns(np.arange(8, 20))
    copied = cols.take(np.arange(12))                      # the same samples in new arrays
    assert cols.values is not None and copied.values is None
    in_place, from_copies = to_sequence_batch(cols), to_sequence_batch(copied)
    for name in ("uih", "candidates", "sparse"):
        a, b = getattr(in_place, name), getattr(from_copies, name)
        assert kjt_equal(a, b) and a.length_per_key() == b.length_per_key(), name
    assert torch.equal(in_place.sparse.values(), torch.cat([in_place.uih.values(), in_place.candidates.values()]))
    assert torch.equal(in_place.sparse.lengths(), torch.cat([in_place.uih.lengths(), in_place.candidates.lengths()]))


def test_bad_settings_name_their_key():
    from dlrmtrain.config.loader import ConfigError
    cfg = tiny_cfg()
    cfg.data.yambda.cross_rows = {"user_x_genre": 5}
    with pytest.raises(ConfigError, match="data.yambda.cross_rows.user_x_genre"):
        build_yambda_loaders(cfg.data, 0, 1, 8, 8)
    cfg = tiny_cfg(num_users=1)
    with pytest.raises(ConfigError, match="data.yambda.synthetic"):
        build_yambda_loaders(cfg.data, 0, 1, 8, 8)
    cfg = tiny_cfg()
    cfg.data.source = "yambda"
    with pytest.raises(ConfigError, match="data.yambda.path"):
        build_yambda_loaders(cfg.data, 0, 1, 8, 8)


def test_the_mini_data_config_keeps_the_reference_rates_at_its_shape():
    from dlrmtrain.config import load_config
    from dlrmtrain.data.yambda.calibration import REFERENCE_UNIQUE_RATES
    from tests.data.raw_rows import REPO_ROOT
    cfg = load_config(REPO_ROOT / "configs" / "data" / "synthetic_yambda_mini.yaml")
    loaders = build_yambda_loaders(cfg.data, 1, 2, 256, 256)          # calibrate: true, per-rank batch 128
    batch = next(loaders.train.batches_from(5))
    for key, target in REFERENCE_UNIQUE_RATES.items():
        ids = batch.uih[key].values()
        assert abs(len(torch.unique(ids)) / len(ids) / target - 1) < 0.15, key
    assert loaders.table_rows["item_id"] == 2000 * 6 * 4 and loaders.table_rows["user_x_artist"] == 50_000
    cfg.data.yambda.max_seq_len = 100
    from dlrmtrain.config.loader import ConfigError
    with pytest.raises(ConfigError, match="synthetic.history_length: 128 events do not fit"):
        build_yambda_loaders(cfg.data, 0, 2, 256, 256)


def _dedup_transform():
    """comm.dedup_at: source's transform over the tiny profile's tables (shared by features)."""
    from dlrmtrain.comm.dedup.sequence_source import SequenceSourceDedup, ShardingFeatures
    from dlrmtrain.sequence_features import TABLES
    rows = YambdaLikeGenerator(PROFILE, CROSSES).table_rows()
    features = [f for _r, fs in TABLES.values() for f in fs]
    return SequenceSourceDedup([ShardingFeatures("table_wise", features,
                                                 [t for t, (_r, fs) in TABLES.items() for _f in fs], rows)])


def _loader(workers: int, last_batch: str) -> SequenceBatchLoader:
    gen = YambdaLikeGenerator(PROFILE, CROSSES)
    windows = [np.arange(0, 50), np.arange(50, 71), np.arange(71, 120)]  # batches cross windows
    loader = SequenceBatchLoader(windows, gen.columns, SequenceLoaderSpec(
        1, 2, 8, "round_robin", last_batch, prefetch=2, workers=workers))
    loader.sparse_transform = _dedup_transform()
    return loader


@pytest.mark.parametrize("last_batch", ["drop", "pad"])
def test_several_workers_make_the_same_batches_in_the_same_order(last_batch):
    made = {w: list(_loader(w, last_batch).iter_weighted()) for w in (1, 2, 3)}
    assert len(made[1]) == _loader(1, last_batch).num_batches
    for w in (2, 3):
        assert len(made[w]) == len(made[1])
        for (a, wa), (b, wb) in zip(made[w], made[1]):
            assert torch.equal(wa, wb) and kjt_equal(a.uih, b.uih) and kjt_equal(a.candidates, b.candidates)
            assert kjt_equal(a.sparse, b.sparse)  # the transform's distinct ids ...
            assert all(torch.equal(x, y) for x, y in zip(a.sparse.expansion.reverse, b.sparse.expansion.reverse))


def test_a_dropped_batchs_memory_is_used_again_and_a_kept_views_is_not(monkeypatch):
    monkeypatch.setattr(RECYCLED_VALUES, "min_length", 0)   # these batches are tiny
    loader, buffers, kept = _loader(2, "drop"), set(), []
    for i, batch in enumerate(loader.batches_from(0)):
        buffers.add(batch.uih.values().data_ptr())
        if i % 2 == 0:
            kept.append((i, batch.uih["item_id"].values()))  # a view: its batch's buffer stays taken
    assert len(buffers) < loader.num_batches                 # the others' buffers came back
    held = list(_loader(1, "drop").batches_from(0))           # every batch alive at once
    assert all(torch.equal(v, held[i].uih["item_id"].values()) for i, v in kept)


def test_a_loader_with_workers_shuts_down_when_its_reader_stops():
    import threading

    batches = _loader(3, "drop").batches_from(0)
    assert next(batches).batch_size == 4
    closer = threading.Thread(target=batches.close, daemon=True)  # the trainer leaving its loop
    closer.start()
    closer.join(timeout=60)  # a hang detector, not a timing check
    assert not closer.is_alive(), "closing the loader hung"
    assert not any(t.name == "yambda-prefetch" and t.is_alive() for t in threading.enumerate())
