"""The Yambda-like synthetic source: its unique rates, calibration, determinism and learnable label."""

from __future__ import annotations

import numpy as np
import pytest

from dlrmtrain.data.yambda.calibration import (REFERENCE_BATCH_SIZE, REFERENCE_UNIQUE_RATES, calibrate,
                                               unique_rates)
from dlrmtrain.data.yambda.cross_hash import cross_ids, unit_hash
from dlrmtrain.data.yambda.events import LIKE_BIT, LP_BIT
from dlrmtrain.data.yambda.synthetic import (GUIDE_BUCKETS, FavouriteCdfs, YambdaLikeGenerator, YambdaLikeProfile,
                                              scaled_profile)
from dlrmtrain.sequence_features import CROSS_SPECS

SMALL = YambdaLikeProfile(num_users=400, num_artists=3000, history_length=48, min_history_fraction=0.5,
                          anchors_per_user=4, eval_anchors_per_user=2, artists_per_user=20.0)
SMALL_CROSSES = [(n, k, 1000, s) for n, k, _r, s in CROSS_SPECS]


def test_the_default_profile_has_the_references_unique_rates_at_its_batch():
    gen = YambdaLikeGenerator(YambdaLikeProfile(), CROSS_SPECS)
    assert gen.profile.history_length == 2627                     # 2.69 M ids / 1024 samples
    for first in (0, 5):                                          # two different batches
        rates = unique_rates(gen, REFERENCE_BATCH_SIZE, num_batches=1, first_batch=first)
        for key, target in REFERENCE_UNIQUE_RATES.items():
            assert abs(rates[key] / target - 1) < 0.08, (first, rates)


def test_calibration_fits_other_targets_at_a_small_shape():
    targets = {"item_id": 0.12, "album_id": 0.075, "artist_id": 0.03}   # the reference's ratios, 5x
    fit = calibrate(SMALL, SMALL_CROSSES, batch_size=64, targets=targets, tolerance=0.04)
    assert fit.iterations > 1                                     # the start was off: it had to move
    rates = unique_rates(YambdaLikeGenerator(fit.profile, SMALL_CROSSES), 64, num_batches=2, first_batch=7)
    for key, target in targets.items():                           # holds on batches it was not fitted on
        assert abs(rates[key] / target - 1) < 0.12, rates
    with pytest.raises(ValueError, match="did not reach"):
        calibrate(scaled_profile(SMALL, albums_per_artist=1), SMALL_CROSSES, 64, targets, max_iterations=4)


def test_samples_are_deterministic_and_random_access():
    a, b = YambdaLikeGenerator(SMALL, SMALL_CROSSES), YambdaLikeGenerator(SMALL, SMALL_CROSSES, cache_users=1)
    b.columns(np.arange(100, 140))                                # different cache history
    ids = np.array([37, 5, 1203, 6])
    ca, cb = a.columns(ids), b.columns(ids)
    for part in ("history", "candidate", "crosses"):
        for key, values in getattr(ca, part).items():
            assert np.array_equal(values, getattr(cb, part)[key]), (part, key)
    assert np.array_equal(ca.history_lengths, cb.history_lengths)
    other = YambdaLikeGenerator(scaled_profile(SMALL, seed=1), SMALL_CROSSES).columns(ids)
    assert not np.array_equal(other.history["item_id"], ca.history["item_id"])


def test_catalog_grouping_user_major_order_and_table_bounds():
    gen = YambdaLikeGenerator(SMALL, SMALL_CROSSES)
    c = gen.columns(np.arange(200))
    h, p = c.history, SMALL
    assert np.array_equal(h["album_id"], h["item_id"] // p.tracks_per_album)
    assert np.array_equal(h["artist_id"], h["album_id"] // p.albums_per_artist)
    assert c.uid.tolist() == np.repeat(np.arange(50), 4).tolist()     # user-major, 4 anchors each
    assert c.history_lengths.min() >= 24 and c.history_lengths.max() <= 48
    rows = gen.table_rows()
    for key, table in (("item_id", "item_id"), ("album_id", "album_id"), ("artist_id", "artist_id")):
        assert h[key].max() < rows[table]
    assert all(c.crosses[n].max() < 1000 for n, *_ in SMALL_CROSSES)
    bits = h["action_weight"]
    assert set(np.unique(bits).tolist()) <= {1, 2, 4} and (bits == LIKE_BIT).mean() < 0.05
    labels = c.candidate["item_action_weight"]
    assert set(np.unique(labels).tolist()) <= {0, LP_BIT} and 0.35 < (labels == LP_BIT).mean() < 0.8
    # consecutive anchors of a user: the next history is the previous one shifted by one event
    ts = np.split(h["action_timestamp"], np.cumsum(c.history_lengths)[:-1])
    assert ts[1][-2] == ts[0][-1] and c.candidate["item_query_time"][0] == ts[0][-1]
    # eval samples continue the same users after their train anchors
    e = gen.columns(np.array([0]), eval_split=True)
    assert e.uid.tolist() == [0] and e.candidate["item_query_time"][0] > ts[3][-1]


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    ranks = np.argsort(np.argsort(scores, kind="stable"), kind="stable") + 1.0
    pos = labels.astype(bool)
    return float((ranks[pos].sum() - pos.sum() * (pos.sum() + 1) / 2) / (pos.sum() * (~pos).sum()))


def test_the_label_is_learnable_from_the_history():
    """The user's listen_plus rate on the candidate's artist in its history predicts the label."""
    gen = YambdaLikeGenerator(scaled_profile(SMALL, history_length=200, min_history_fraction=1.0), SMALL_CROSSES)
    c = gen.columns(np.arange(1600))
    owner = np.repeat(np.arange(len(c.uid)), c.history_lengths)
    same_artist = c.history["artist_id"] == c.candidate["item_candidate_artist_id"][owner]
    listens = same_artist & (c.history["action_weight"] != LIKE_BIT)
    lp = np.bincount(owner, weights=listens & (c.history["action_weight"] == LP_BIT), minlength=len(c.uid))
    n = np.bincount(owner, weights=listens, minlength=len(c.uid))
    score = (lp + 0.6) / (n + 1.0)                                 # smoothed toward the overall rate
    assert auc(score, c.candidate["item_action_weight"] == LP_BIT) > 0.65


def test_the_reference_shape_config_fits_the_full_size_tables():
    from dlrmtrain.config import load_config
    from dlrmtrain.data.yambda.builder import cross_specs, synthetic_profile
    from dlrmtrain.sequence_features import TABLES
    from tests.data.raw_rows import REPO_ROOT
    cfg = load_config(REPO_ROOT / "configs" / "data" / "synthetic_yambda.yaml")
    rows = YambdaLikeGenerator(synthetic_profile(cfg.data), cross_specs(cfg.data)).table_rows()
    assert set(rows) == set(TABLES)
    assert all(rows[name] <= TABLES[name][0] for name in TABLES), rows


def reference_user(gen: YambdaLikeGenerator, u: int) -> dict[str, np.ndarray]:
    """User u's events by the generator's first, per-user algorithm (one stream draw after
    another, each array its own numpy call): what the batched generator must give bit for bit."""
    p = gen.profile

    def cdf(n: int, s: float) -> np.ndarray:
        c = np.cumsum(np.arange(1, n + 1, dtype=np.float64) ** -s)
        return c / c[-1]

    def draw(c: np.ndarray, x: np.ndarray) -> np.ndarray:
        return np.minimum(np.searchsorted(c, x, side="right"), len(c) - 1)

    rng = np.random.default_rng([p.seed, u])
    n_fav = max(1, int(rng.poisson(p.artists_per_user)))
    fav = np.random.default_rng([p.seed, 0xA57]).permutation(p.num_artists)[
        draw(cdf(p.num_artists, p.artist_zipf), rng.random(n_fav))]
    affinity = rng.standard_normal(n_fav)
    bias = 0.5 * rng.standard_normal()
    hist_len = int(rng.integers(max(1, int(np.ceil(p.min_history_fraction * p.history_length))),
                                p.history_length + 1))
    n = p.history_length + p.anchors_per_user + p.eval_anchors_per_user
    slot = draw(cdf(n_fav, p.user_zipf), rng.random(n))
    artist = fav[slot].astype(np.int64)
    album = artist * p.albums_per_artist + draw(cdf(p.albums_per_artist, p.album_zipf), rng.random(n))
    item = album * p.tracks_per_album + draw(cdf(p.tracks_per_album, p.track_zipf), rng.random(n))
    organic = (rng.random(n) < p.organic_share).astype(np.int64)
    quality = (unit_hash(item, p.seed) - 0.5) * np.sqrt(12.0)
    logit = 0.6 + 1.5 * affinity[slot] + quality + bias + 0.3 * (2 * organic - 1)
    listen_plus = rng.random(n) < 1.0 / (1.0 + np.exp(-logit))
    like = rng.random(n) < p.like_share
    like[p.history_length:] = False
    bits = np.where(like, LIKE_BIT, np.where(listen_plus, LP_BIT, 4)).astype(np.int64)
    start = 1_600_000_000 + int(unit_hash(np.array([u]), p.seed + 1)[0] * 30 * 86_400)
    ts = start + np.cumsum(rng.exponential(180.0, n)).astype(np.int64)
    return dict(item=item, album=album, artist=artist, bits=bits, ts=ts, organic=organic, hist_len=hist_len)


def reference_history(gen: YambdaLikeGenerator, sample_ids: np.ndarray, eval_split: bool):
    """(lengths, history columns, anchor events) of samples, sample after sample."""
    users, ks = gen.sample_positions(sample_ids, eval_split)
    hist = {c: [] for c in ("item", "artist", "album", "bits", "ts")}
    lengths, anchor = [], {c: [] for c in ("item", "artist", "album", "bits", "ts", "organic")}
    for u, k in zip(users.tolist(), ks.tolist()):
        ev, a = reference_user(gen, u), gen.profile.history_length + k
        for c in hist:
            hist[c].append(ev[c][a - ev["hist_len"]:a])
        for c in anchor:
            anchor[c].append(ev[c][a])
        lengths.append(ev["hist_len"])
    return lengths, {c: np.concatenate(v) for c, v in hist.items()}, {c: np.array(v) for c, v in anchor.items()}


@pytest.mark.parametrize("profile, ids, eval_split", [
    (SMALL, np.array([37, 5, 1203, 6, 5, 0, 1599]), False),                 # repeats, out of order
    (SMALL, np.arange(0, 300, 7), True),
    (SMALL, np.array([8, 9, 10, 11, 9, 10, 2, 3, 3]), False),                 # runs of anchors, broken and repeated
    (scaled_profile(SMALL, num_artists=5, history_length=3, min_history_fraction=0.0, artists_per_user=0.7,
                    albums_per_artist=1, seed=7), np.arange(40), False),   # often one favourite, histories of 1
])
def test_batched_users_are_the_per_user_algorithms_events_bit_for_bit(profile, ids, eval_split):
    gen = YambdaLikeGenerator(profile, SMALL_CROSSES, cache_users=3)     # the cache evicts within a batch
    got = gen.columns(ids, eval_split)
    lengths, hist, anchor = reference_history(gen, ids, eval_split)
    assert got.history_lengths.tolist() == lengths and got.uid.dtype == np.int64
    for col, ref in (("item_id", "item"), ("artist_id", "artist"), ("album_id", "album"),
                     ("action_weight", "bits"), ("action_timestamp", "ts")):
        assert got.history[col].dtype == np.int64 and np.array_equal(got.history[col], hist[ref]), col
    for col, ref in (("item_candidate_id", "item"), ("item_candidate_artist_id", "artist"),
                     ("item_candidate_album_id", "album")):
        assert np.array_equal(got.candidate[col], anchor[ref]), col
    assert np.array_equal(got.candidate["item_action_weight"], np.where(anchor["bits"] == LP_BIT, LP_BIT, 0))
    keys = {"uid": gen.sample_positions(ids, eval_split)[0], "item_id": anchor["item"], "artist_id": anchor["artist"],
            "album_id": anchor["album"], "hour_of_day": anchor["ts"] // 3600 % 24, "is_organic": anchor["organic"]}
    for name, k, rows, salt in SMALL_CROSSES:
        assert np.array_equal(got.crosses[name], cross_ids(keys, k, rows, salt)), name


def test_the_guided_draw_is_searchsorteds_on_its_edges():
    """Keys on and beside every cdf value and bucket edge, for few favourites (one cdf value per
    bucket at most) and many (thousands of values: several per bucket)."""
    cdfs = FavouriteCdfs(0.8)
    edges = np.arange(GUIDE_BUCKETS) / GUIDE_BUCKETS
    for k in [*range(1, 41), 331, 5000]:
        cdf = cdfs.cdf(k)
        keys = np.concatenate([cdf, edges, np.random.default_rng(k).random(200)])
        keys = np.concatenate([keys, np.nextafter(keys, 0.0), np.nextafter(keys, 1.0)])
        keys = keys[(keys >= 0.0) & (keys < 1.0)]
        keys = keys[:len(keys) // 2 * 2].reshape(2, -1)          # two rows: the same count twice
        got = cdfs.draw(np.array([k, k]), keys)
        assert np.array_equal(got, np.minimum(np.searchsorted(cdf, keys, side="right"), k - 1)), k
