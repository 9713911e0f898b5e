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

A batch's users are made together (`YambdaLikeGenerator.users`): each user's draws still come
from its own stream in the order above (its per-event uniforms in one call), and the rest runs
on [users, events] arrays, so the events are bitwise the per-user algorithm's (the test keeps
that algorithm as its reference) at ~0.1 s instead of ~0.3 s of CPU per reference-shape batch;
the histories are written straight into the batch's KJT values (`BatchValues`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from dlrmtrain.config.schema import SyntheticYambdaConfig
from dlrmtrain.data.yambda.batch import HISTORY_COLUMNS, BatchValues, SampleColumns
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


def _draw_sorted(cdf: np.ndarray, u: np.ndarray) -> np.ndarray:
    """`_draw` with the keys searched in increasing order: the same indices, far fewer cache
    misses on a long cdf (the artist catalog's)."""
    order = np.argsort(u)
    out = np.empty(len(u), np.int64)
    out[order] = _draw(cdf, u[order])
    return out


GUIDE_BUCKETS = 1024
"""Buckets of a favourite cdf's guide table (a power of 2: u * GUIDE_BUCKETS is exact)."""


class FavouriteCdfs:
    """`_draw` over each user's favourites (the Zipf cdf of its favourite count), for many users
    at once. Per count, the cdf followed by +inf and its guide table (Chen and Asau's):
    guide[b] = #{cdf <= b / GUIDE_BUCKETS}, the answer's lower bound for any u in bucket b, from
    where a few rounds of comparisons reach searchsorted's answer exactly."""

    def __init__(self, s: float) -> None:
        self.s = s
        self._made: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def cdf(self, k: int) -> np.ndarray:
        return self._of(k)[0][:-1]

    def _of(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        made = self._made.get(k)
        if made is None:
            cdf = _zipf_cdf(k, self.s)
            guide = np.searchsorted(cdf, np.arange(GUIDE_BUCKETS) / GUIDE_BUCKETS, side="right")
            made = self._made.setdefault(k, (np.append(cdf, np.inf), guide))  # workers: one of the same two
        return made

    def draw(self, counts: np.ndarray, u: np.ndarray) -> np.ndarray:
        """[U, n]: _draw(_zipf_cdf(counts[j], s), u[j]) for each row j of u ([U, n] in [0, 1))."""
        made = [self._of(k) for k in counts.tolist()]
        cdfs = np.concatenate([c for c, _g in made])
        first = np.cumsum(counts + 1) - (counts + 1)             # row j's cdf starts there in cdfs
        guide = np.stack([g for _c, g in made]) + first[:, None]
        pos = guide[np.arange(len(counts))[:, None], (u * GUIDE_BUCKETS).astype(np.int64)].ravel()
        keys = u.ravel()
        moving = np.arange(len(pos))
        while len(moving):                                       # a few rounds: ~1 cdf value per bucket
            moving = moving[cdfs[pos[moving]] <= keys[moving]]   # a row's +inf stops it at its end
            pos[moving] += 1
        return np.minimum(pos.reshape(u.shape) - first[:, None], (counts - 1)[:, None])


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


_UNIFORMS = 6
"""Uniform draws per event: favourite slot, album, track, organic, listen_plus, like."""


@dataclass
class _UserDraws:
    """The random draws of several users, row j from user j's stream."""

    favourites: np.ndarray
    """[U] favourite artists per user."""
    favourite_keys: list[np.ndarray]
    """Per user: the uniforms that pick its favourites from the catalog."""
    affinity: list[np.ndarray]
    """Per user: its affinity to each favourite."""
    bias: np.ndarray
    """[U] the users' biases."""
    history_len: np.ndarray
    """[U] the users' history lengths."""
    uniforms: np.ndarray
    """[U, _UNIFORMS, events] the per-event uniforms, in _UNIFORMS' order."""
    gaps: np.ndarray
    """[U, events] the gaps (seconds) between consecutive events."""


_HISTORY_FIELDS = (("item_id", "item"), ("artist_id", "artist"), ("album_id", "album"),
                   ("action_weight", "bits"), ("action_timestamp", "timestamp"))
"""A sample's history columns and the UserEvents fields they come from."""
_ANCHOR_FIELDS = (("item_id", "item"), ("artist_id", "artist"), ("album_id", "album"), ("ts", "timestamp"),
                  ("is_organic", "organic"), ("bits", "bits"))
"""What a sample keeps of its anchor event, from those fields."""


def _windows(events: np.ndarray, start: int, length: int, count: int) -> np.ndarray:
    """[count, length] view: events[start + i : start + i + length] in row i (no copy)."""
    if start < 0 or start + length + count - 1 > len(events):  # as_strided would read past the array
        raise IndexError(f"windows {start}..{start + length + count - 1} outside {len(events)} events")
    step = events.strides[0]
    return np.lib.stride_tricks.as_strided(events[start:], (count, length), (step, step), writeable=False)


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
        self._user_cdfs = FavouriteCdfs(p.user_zipf)
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
        return self.users([u])[0]

    def users(self, us: Sequence[int]) -> list[UserEvents]:
        """Events of users `us` (distinct): the cached ones, the others generated together."""
        with self._cache_lock:  # the loader's workers share the cache
            found = {u: self._cache.get(u) for u in us}
            for u, ev in found.items():
                if ev is not None:
                    self._cache.move_to_end(u)
        missing = [u for u, ev in found.items() if ev is None]
        if missing:  # made outside the lock: two workers may both make a user, the same events
            made = self._generate(np.asarray(missing, dtype=np.int64))
            found.update(zip(missing, made))
            with self._cache_lock:
                self._cache.update(zip(missing, made))
                while len(self._cache) > self._cache_users:
                    self._cache.popitem(last=False)
        return [found[u] for u in us]

    def _streams(self, users: np.ndarray) -> _UserDraws:
        """Every draw of each user from its own stream (seed, u), in the stream's order; one
        user's uniforms in one call (consecutive random() calls of one stream are one longer call)."""
        p = self.profile
        n = p.history_length + p.anchors_per_user + p.eval_anchors_per_user
        lo = max(1, int(np.ceil(p.min_history_fraction * p.history_length)))
        d = _UserDraws(np.empty(len(users), np.int64), [], [], np.empty(len(users)),
                       np.empty(len(users), np.int64), np.empty((len(users), _UNIFORMS, n)),
                       np.empty((len(users), n)))
        for j, u in enumerate(users.tolist()):
            rng = np.random.default_rng([p.seed, u])
            d.favourites[j] = n_fav = max(1, int(rng.poisson(p.artists_per_user)))
            d.favourite_keys.append(rng.random(n_fav))
            d.affinity.append(rng.standard_normal(n_fav))
            d.bias[j] = 0.5 * rng.standard_normal()
            d.history_len[j] = int(rng.integers(lo, p.history_length + 1))
            rng.random(out=d.uniforms[j].reshape(-1))
            d.gaps[j] = rng.exponential(180.0, n)
        return d

    def _generate(self, users: np.ndarray) -> list[UserEvents]:
        """The events of `users`, each user a row of arrays computed for all of them at once."""
        p, d = self.profile, self._streams(users)
        slot_u, album_u, track_u, organic_u, listen_u, like_u = (d.uniforms[:, k] for k in range(_UNIFORMS))
        fav = self._artist_ids[_draw_sorted(self._artist_cdf, np.concatenate(d.favourite_keys))]
        slot = self._user_cdfs.draw(d.favourites, slot_u) + (np.cumsum(d.favourites) - d.favourites)[:, None]
        artist = fav[slot].astype(np.int64)
        album = artist * p.albums_per_artist + _draw(self._album_cdf, album_u)
        item = album * p.tracks_per_album + _draw(self._track_cdf, track_u)
        organic = (organic_u < p.organic_share).astype(np.int64)
        quality = (unit_hash(item, p.seed) - 0.5) * np.sqrt(12.0)
        logit = (0.6 + 1.5 * np.concatenate(d.affinity)[slot] + quality + d.bias[:, None]
                 + 0.3 * (2 * organic - 1))
        listen_plus = listen_u < 1.0 / (1.0 + np.exp(-logit))
        like = like_u < p.like_share
        like[:, p.history_length:] = False                    # anchors are listens
        bits = np.where(like, LIKE_BIT, np.where(listen_plus, LP_BIT, SKIP_BIT)).astype(np.int64)
        start = 1_600_000_000 + (unit_hash(users, p.seed + 1) * 30 * 86_400).astype(np.int64)
        ts = start[:, None] + np.cumsum(d.gaps, axis=1).astype(np.int64)
        return [UserEvents(*cols, int(h)) for *cols, h in zip(item, album, artist, bits, ts, organic, d.history_len)]

    def sample_positions(self, sample_ids: np.ndarray, eval_split: bool) -> tuple[np.ndarray, np.ndarray]:
        """(user, anchor offset) of train or eval sample ids."""
        p, ids = self.profile, np.asarray(sample_ids, dtype=np.int64)
        per = p.eval_anchors_per_user if eval_split else p.anchors_per_user
        users, k = ids // per, ids % per
        return users, k + (p.anchors_per_user if eval_split else 0)

    def columns(self, sample_ids: np.ndarray, eval_split: bool = False) -> SampleColumns:
        """Features of train (or eval) samples `sample_ids`."""
        users, ks = self.sample_positions(sample_ids, eval_split)
        distinct = list(dict.fromkeys(users.tolist()))
        by_user = dict(zip(distinct, self.users(distinct)))
        # runs of samples of one user at consecutive anchors (user-major: a user's samples), whose
        # histories are consecutive windows of its events: one copy per run and column
        cut = np.flatnonzero((users[1:] != users[:-1]) | (ks[1:] != ks[:-1] + 1)) + 1
        runs = list(zip([0, *cut.tolist()], [*cut.tolist(), len(users)])) if len(users) else []
        lengths = np.zeros(len(users), np.int64)
        for first, end in runs:
            lengths[first:end] = by_user[int(users[first])].history_len
        made = BatchValues(len(users), int(lengths.sum()))  # the histories go straight to the KJT's values
        anchor = {c: np.empty(len(users), np.int64) for c, _f in _ANCHOR_FIELDS}
        at = 0
        for first, end in runs:
            ev, a = by_user[int(users[first])], self.profile.history_length + int(ks[first])
            h, m = ev.history_len, end - first
            for column, field in _HISTORY_FIELDS:
                made.of[column][at:at + m * h].reshape(m, h)[...] = _windows(getattr(ev, field), a - h, h, m)
            for column, field in _ANCHOR_FIELDS:
                anchor[column][first:end] = getattr(ev, field)[a:a + m]
            at += m * h
        return self._sample_columns(users, lengths, made, anchor)

    def _sample_columns(self, users: np.ndarray, lengths: np.ndarray, made: BatchValues,
                        anchor: dict[str, np.ndarray]) -> SampleColumns:
        """The samples' columns from their histories and anchor events: crosses and candidates."""
        history = {c: made.of[c] for c in HISTORY_COLUMNS}
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
                       "item_action_weight": np.where(anchor["bits"] == LP_BIT, LP_BIT, 0).astype(np.int64)},
            values=made)


def scaled_profile(profile: YambdaLikeProfile, **changes: object) -> YambdaLikeProfile:
    """The profile with some fields changed (e.g. a smaller catalog or shorter histories)."""
    return replace(profile, **changes)
