"""The hashed cross features: the reference's `xxhash_cross`, vectorised, bit for bit.

The MLPerf reference (mlcommons/training recommendation_v4, PR #889,
`dlrm_v4/datasets/utils.py: xxhash_cross`) hashes each cross as
`xxh64(seed=salt)` over the little-endian int64 values of its keys, then takes
the digest modulo the table size. Crosses have 2 or 3 keys, i.e. 16 or 24 bytes:
always xxh64's short-input path (under 32 bytes, whole 8-byte lanes only). That
path is written here in numpy uint64 arithmetic (wrapping mod 2**64, as the C
code), so a batch hashes in one pass without the `xxhash` package; the tests check
it against a plain transcription of the xxh64 specification and, when installed,
against `xxhash` itself.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def xxh64_int64_lanes(lanes: Sequence[np.ndarray], seed: int = 0) -> np.ndarray:
    """xxh64(seed) of each row of little-endian int64 lanes (1-3 lanes: under 32 bytes).

    `lanes[k][i]` is the k-th int64 of row i; returns the uint64 digests.
    """
    if not 1 <= len(lanes) <= 3:
        raise ValueError(f"xxh64_int64_lanes: {len(lanes)} lanes; the short path takes 1 to 3")
    cols = [np.asarray(c, dtype=np.int64).astype(np.uint64).ravel() for c in lanes]
    with np.errstate(over="ignore"):
        h = np.full(cols[0].shape, np.uint64(seed & 0xFFFFFFFFFFFFFFFF), dtype=np.uint64)
        h += _P5 + np.uint64(8 * len(cols))
        for lane in cols:
            k = _rotl(lane * _P2, 31) * _P1          # XXH64_round(0, lane)
            h ^= k
            h = _rotl(h, 27) * _P1 + _P4
        h ^= h >> np.uint64(33)                      # avalanche
        h *= _P2
        h ^= h >> np.uint64(29)
        h *= _P3
        h ^= h >> np.uint64(32)
    return h


def cross_ids(values: Mapping[str, np.ndarray], keys: Sequence[str], table_size: int,
              salt: int = 0) -> np.ndarray:
    """int64 row ids of one cross for a batch: xxh64(salt) of the keys' int64 values mod table_size.

    Equals the reference's `xxhash_cross(anchor, keys, table_size, salt)` per row.
    """
    if len(keys) < 2:
        raise ValueError(f"a cross needs at least 2 keys, got {list(keys)}")
    digest = xxh64_int64_lanes([values[k] for k in keys], salt)
    return (digest % np.uint64(table_size)).astype(np.int64)


def hour_of_day(timestamps: np.ndarray) -> np.ndarray:
    """The reference's hour feature: (seconds // 3600) % 24 (UTC hours of the anchor event)."""
    return (np.asarray(timestamps, dtype=np.int64) // 3600) % 24


def unit_hash(values: np.ndarray, salt: int = 0) -> np.ndarray:
    """A splitmix64 finalizer of value + salt → float64 in [0, 1) (the reference's `_uid_unit_hash`,
    which splits users into train and held-out; also the synthetic source's fixed item qualities)."""
    with np.errstate(over="ignore"):
        z = np.asarray(values).astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15) + np.uint64(salt & (2**64 - 1))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)
