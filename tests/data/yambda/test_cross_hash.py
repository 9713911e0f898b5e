"""The vectorised cross hash equals the reference's `xxhash_cross`, bit for bit."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from dlrmtrain.data.yambda.cross_hash import cross_ids, hour_of_day, unit_hash, xxh64_int64_lanes
from dlrmtrain.sequence_features import CROSS_SPECS

M = (1 << 64) - 1
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                      0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & M


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * P2) & M, 31) * P1) & M


def xxh64_spec(data: bytes, seed: int = 0) -> int:
    """xxh64 transcribed from the xxHash specification (every input length), as the test's oracle."""
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + P1 + P2) & M, (seed + P2) & M, seed & M, (seed - P1) & M]
        while i + 32 <= n:
            v = [_round(v[k], struct.unpack_from("<Q", data, i + 8 * k)[0]) for k in range(4)]
            i += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & M
        for acc in v:
            h = ((h ^ _round(0, acc)) * P1 + P4) & M
    else:
        h = (seed + P5) & M
    h = (h + n) & M
    while i + 8 <= n:
        h = (_rotl(h ^ _round(0, struct.unpack_from("<Q", data, i)[0]), 27) * P1 + P4) & M
        i += 8
    if i + 4 <= n:
        h = (_rotl(h ^ (struct.unpack_from("<I", data, i)[0] * P1 & M), 23) * P2 + P3) & M
        i += 4
    while i < n:
        h = (_rotl(h ^ (data[i] * P5 & M), 11) * P1) & M
        i += 1
    h ^= h >> 33
    h = (h * P2) & M
    h ^= h >> 29
    h = (h * P3) & M
    return h ^ (h >> 32)


def reference_xxhash_cross(anchor: dict, keys, table_size: int, salt: int = 0) -> int:
    """The reference's formula (dlrm_v4/datasets/utils.py: xxhash_cross) over the spec's xxh64."""
    return xxh64_spec(struct.pack(f"<{len(keys)}q", *(int(anchor[k]) for k in keys)), salt) % table_size


@pytest.mark.parametrize("data, seed, digest", [
    (b"", 0, 0xEF46DB3751D8E999), (b"a", 0, 0xD24EC4F1A98C6E5B), (b"abc", 0, 0x44BC2CF5AD770999),
    (b"Nobody inspects the spammish repetition", 0, 0xFBCEA83C8A378BF1)])
def test_the_oracle_gives_xxh64s_published_digests(data, seed, digest):
    assert xxh64_spec(data, seed) == digest


@pytest.mark.parametrize("lanes", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 5, (1 << 63) + 11])
def test_vectorised_xxh64_equals_the_spec(lanes, seed):
    rng = np.random.default_rng(lanes)
    cols = [rng.integers(-(1 << 63), (1 << 63) - 1, 300, dtype=np.int64) for _ in range(lanes)]
    cols[0][:3] = [0, -1, (1 << 63) - 1]
    got = xxh64_int64_lanes(cols, seed)
    want = [xxh64_spec(struct.pack(f"<{lanes}q", *(int(c[i]) for c in cols)), seed) for i in range(300)]
    assert got.tolist() == want


def test_every_reference_cross_equals_the_reference_formula():
    rng = np.random.default_rng(0)
    n = 200
    ts = rng.integers(1_600_000_000, 1_700_000_000, n)
    anchor = {"uid": rng.integers(0, 1_000_000, n), "item_id": rng.integers(0, 9_390_624, n),
              "artist_id": rng.integers(0, 1_293_395, n), "album_id": rng.integers(0, 3_367_692, n),
              "hour_of_day": hour_of_day(ts), "is_organic": rng.integers(0, 2, n)}
    for name, keys, rows, salt in CROSS_SPECS + [("salted", ("uid", "item_id"), 1000, 42)]:
        got = cross_ids(anchor, keys, rows, salt)
        want = [reference_xxhash_cross({k: v[i] for k, v in anchor.items()}, keys, rows, salt) for i in range(n)]
        assert got.tolist() == want, name
        assert got.dtype == np.int64 and got.min() >= 0 and got.max() < rows


def test_against_the_xxhash_package_when_installed():
    xxhash = pytest.importorskip("xxhash", reason="optional: the spec oracle above covers it")
    anchor = {"uid": 12345, "artist_id": 678, "hour_of_day": 23}
    keys = ("uid", "artist_id", "hour_of_day")
    d = xxhash.xxh64(seed=0)
    d.update(struct.pack("<3q", 12345, 678, 23))
    assert cross_ids({k: np.array([v]) for k, v in anchor.items()}, keys, 40_000_000)[0] == \
        d.intdigest() % 40_000_000


def test_hour_of_day_and_a_cross_needs_two_keys():
    assert hour_of_day(np.array([0, 3599, 3600, 86_399, 86_400 + 7200])).tolist() == [0, 0, 1, 23, 2]
    with pytest.raises(ValueError, match="at least 2 keys"):
        cross_ids({"uid": np.array([1])}, ("uid",), 10)


def test_unit_hash_is_the_reference_splitmix():
    # Reference `_uid_unit_hash` for uid 0, salt 0: splitmix64(0x9E3779B97F4A7C15) >> 11 / 2**53.
    z = 0x9E3779B97F4A7C15
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    z ^= z >> 31
    assert unit_hash(np.array([0]), 0)[0] == (z >> 11) / 2**53
    u = unit_hash(np.arange(10_000), 3)
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.02
