"""A Yambda-like synthetic source: long user-major histories over an artist / album / track catalog.

Each user u is generated from its own random stream (seed, u), so any sample is built
without generating the ones before it (rank slices and resumption are free). A user:

- picks ~`artists_per_user` favourite artists from the catalog (global Zipf popularity,
  exponent `artist_zipf`), an affinity per favourite and a user bias;
- listens `history_length + anchors + eval_anchors` times: artist among the favourites
  (Zipf `user_zipf` over them), album of that artist (Zipf `album_zipf`), track of the
  album (Zipf `track_zipf`); item popularity is thus Zipf-like and items group under
  albums and artists (item = (artist * albums_per_artist + album) * tracks_per_album + track);
- each event is a like (probability `like_share`) or a listen, listen_plus with probability
  sigmoid(0.6 + 1.5 affinity + quality(item) + bias + 0.3 (2 organic - 1)), else a skip
  (affinity ~ N(0, 1), quality uniform with unit variance, bias ~ N(0, 0.5^2)), so
  the label depends on user-artist affinity that the history reveals (the model can learn
  it), on a fixed per-item quality and on the user;
- timestamps advance by exponential gaps (mean 3 minutes) from a per-user start, so the
  hour-of-day crosses vary.

Samples are user-major: train sample i is user i // A, anchor i % A (A = anchors per user),
the anchor event at position history_length + i % A; its history is the `L_u` events just
before it (L_u per user, uniform in [min_history_fraction * history_length, history_length];
all synthetic events are in a pool, so this is the reference's `last_n` history). Eval
samples are the next `eval_anchors_per_user` anchors of the same users (the reference
evaluates the window after the trained ones). Crosses are hashed as the reference does.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from dlrmtrain.config.schema import SyntheticYambdaConfig
from dlrmtrain.data.yambda.batch import SampleColumns
from dlrmtrain.data.yambda.cross_hash import cross_ids, hour_of_day, unit_hash
from dlrmtrain.data.yambda.events import LIKE_BIT, LP_BIT, SKIP_BIT

CrossSpec = tuple[str, Sequence[str], int, int]


@dataclass
class YambdaLikeProfile(SyntheticYambdaConfig):
    """Shape of the synthetic data: the `data.yambda.synthetic` section (its fields and its
    defaults, documented there; its `calibrate` is for the builder, the generator ignores it)
    and two shares users do not set. The defaults are the reference-shape calibration
    (calibration.py: in-batch unique rates 2.4 % item, 1.5 % album, 0.6 % artist at local
    batch 1024, ~2627 history events per sample) over a full-size catalog (9.38 M items)."""

    like_share: float = 0.019
    """Share of events that are likes (the others are listens)."""
    organic_share: float = 0.5
    """Share of events flagged organic (`is_organic`), which moves a listen's odds of listen_plus."""

    @property
    def num_items(self) -> int:
        return self.num_artists * self.albums_per_artist * self.tracks_per_album

    @property
    def num_albums(self) -> int:
        return self.num_artists * self.albums_per_artist


def _zipf_cdf(n: int, s: float) -> np.ndarray:
    w = np.arange(1, n + 1, dtype=np.float64) ** -s
    c = np.cumsum(w)
    return c / c[-1]


def _draw(cdf: np.ndarray, u: np.ndarray) -> np.ndarray:
    return np.minimum(np.searchsorted(cdf, u, side="right"), len(cdf) - 1)


@dataclass
class UserEvents:
    """One user's generated events (positions 0 .. history_length + all anchors - 1)."""

    item: np.ndarray
    album: np.ndarray
    artist: np.ndarray
    bits: np.ndarray
    timestamp: np.ndarray
    organic: np.ndarray
    history_len: int


class YambdaLikeGenerator:
    """Deterministic users and samples of a profile (same profile and seed: same data on every rank)."""

    def __init__(self, profile: YambdaLikeProfile, crosses: Sequence[CrossSpec], cache_users: int = 256) -> None:
        p = self.profile = profile
        self.crosses = [(n, tuple(k), int(r), int(s)) for n, k, r, s in crosses]
        rng = np.random.default_rng([p.seed, 0xA57])
        self._artist_ids = rng.permutation(p.num_artists)   # popularity rank → id (ids not sorted by rank)
        self._artist_cdf = _zipf_cdf(p.num_artists, p.artist_zipf)
        self._album_cdf = _zipf_cdf(p.albums_per_artist, p.album_zipf)
        self._track_cdf = _zipf_cdf(p.tracks_per_album, p.track_zipf)
        self._cache: OrderedDict[int, UserEvents] = OrderedDict()
        self._cache_users = cache_users
        self._cache_lock = threading.Lock()

    @property
    def num_train_samples(self) -> int:
        return self.profile.num_users * self.profile.anchors_per_user

    @property
    def num_eval_samples(self) -> int:
        return self.profile.num_users * self.profile.eval_anchors_per_user

    def table_rows(self) -> dict[str, int]:
        """Rows the id tables need for this data (the crosses' rows are their specs')."""
        p = self.profile
        return {"item_id": p.num_items, "artist_id": p.num_artists, "album_id": p.num_albums,
                "uid": p.num_users, **{name: rows for name, _k, rows, _s in self.crosses}}

    def user(self, u: int) -> UserEvents:
        with self._cache_lock:  # the loader's workers share the cache
            hit = self._cache.get(u)
            if hit is not None:
                self._cache.move_to_end(u)
                return hit
        ev = self._generate(u)  # outside the lock: two workers may both make u, the same events
        with self._cache_lock:
            self._cache[u] = ev
            if len(self._cache) > self._cache_users:
                self._cache.popitem(last=False)
        return ev

    def _generate(self, u: int) -> UserEvents:
        p = self.profile
        rng = np.random.default_rng([p.seed, u])
        n_fav = max(1, int(rng.poisson(p.artists_per_user)))
        fav = self._artist_ids[_draw(self._artist_cdf, rng.random(n_fav))]
        affinity = rng.standard_normal(n_fav)
        bias = 0.5 * rng.standard_normal()
        lo = int(np.ceil(p.min_history_fraction * p.history_length))
        hist_len = int(rng.integers(max(1, lo), p.history_length + 1))
        n = p.history_length + p.anchors_per_user + p.eval_anchors_per_user
        slot = _draw(_zipf_cdf(n_fav, p.user_zipf), rng.random(n))
        artist = fav[slot].astype(np.int64)
        album = artist * p.albums_per_artist + _draw(self._album_cdf, rng.random(n))
        item = album * p.tracks_per_album + _draw(self._track_cdf, rng.random(n))
        organic = (rng.random(n) < p.organic_share).astype(np.int64)
        quality = (unit_hash(item, p.seed) - 0.5) * np.sqrt(12.0)
        logit = 0.6 + 1.5 * affinity[slot] + quality + bias + 0.3 * (2 * organic - 1)
        listen_plus = rng.random(n) < 1.0 / (1.0 + np.exp(-logit))
        like = rng.random(n) < p.like_share
        like[p.history_length:] = False                       # anchors are listens
        bits = np.where(like, LIKE_BIT, np.where(listen_plus, LP_BIT, SKIP_BIT)).astype(np.int64)
        start = 1_600_000_000 + int(unit_hash(np.array([u]), p.seed + 1)[0] * 30 * 86_400)
        ts = start + np.cumsum(rng.exponential(180.0, n)).astype(np.int64)
        return UserEvents(item, album, artist, bits, ts, organic, hist_len)

    def sample_positions(self, sample_ids: np.ndarray, eval_split: bool) -> tuple[np.ndarray, np.ndarray]:
        """(user, anchor offset) of train or eval sample ids."""
        p, ids = self.profile, np.asarray(sample_ids, dtype=np.int64)
        per = p.eval_anchors_per_user if eval_split else p.anchors_per_user
        users, k = ids // per, ids % per
        return users, k + (p.anchors_per_user if eval_split else 0)

    def columns(self, sample_ids: np.ndarray, eval_split: bool = False) -> SampleColumns:
        """Features of train (or eval) samples `sample_ids`."""
        L = self.profile.history_length
        users, ks = self.sample_positions(sample_ids, eval_split)
        hist = {c: [] for c in ("item_id", "artist_id", "album_id", "action_weight", "action_timestamp")}
        lengths = np.zeros(len(users), np.int64)
        anchor = {c: np.zeros(len(users), np.int64) for c in ("item_id", "artist_id", "album_id", "ts",
                                                               "is_organic", "bits")}
        for i, (u, k) in enumerate(zip(users.tolist(), ks.tolist())):
            ev = self.user(u)
            a = L + k
            s = slice(a - ev.history_len, a)
            for c, src in (("item_id", ev.item), ("artist_id", ev.artist), ("album_id", ev.album),
                           ("action_weight", ev.bits), ("action_timestamp", ev.timestamp)):
                hist[c].append(src[s])
            lengths[i] = ev.history_len
            for c, src in (("item_id", ev.item), ("artist_id", ev.artist), ("album_id", ev.album),
                           ("ts", ev.timestamp), ("is_organic", ev.organic), ("bits", ev.bits)):
                anchor[c][i] = src[a]
        history = {c: np.concatenate(v) if v else np.zeros(0, np.int64) for c, v in hist.items()}
        ends = np.cumsum(lengths)
        query_time = np.where(lengths > 0, history["action_timestamp"][np.maximum(ends - 1, 0)]
                              if len(history["action_timestamp"]) else 0, anchor["ts"])
        keys = {"uid": users, "item_id": anchor["item_id"], "artist_id": anchor["artist_id"],
                "album_id": anchor["album_id"], "hour_of_day": hour_of_day(anchor["ts"]),
                "is_organic": anchor["is_organic"]}
        return SampleColumns(
            uid=users.astype(np.int64),
            crosses={name: cross_ids(keys, k, rows, salt) for name, k, rows, salt in self.crosses},
            history_lengths=lengths, history=history,
            candidate={"item_candidate_id": anchor["item_id"], "item_candidate_artist_id": anchor["artist_id"],
                       "item_candidate_album_id": anchor["album_id"], "item_query_time": query_time,
                       "item_action_weight": np.where(anchor["bits"] == LP_BIT, LP_BIT, 0).astype(np.int64)})


def scaled_profile(profile: YambdaLikeProfile, **changes: object) -> YambdaLikeProfile:
    """The profile with some fields changed (e.g. a smaller catalog or shorter histories)."""
    return replace(profile, **changes)
