"""Calibrated table sizes and id skew for the synthetic generator's `kaggle` and `terabyte` profiles.

The generator draws table t's ids from the bounded power law of `power_law_ids`
(P(id = k) ∝ (k + 1)^-s_t, discretised from the continuous law on [1, n + 1]).
What the dedup codec sees is the distinct fraction of a batch, E[#distinct ids in
B draws] / B, so each profile picks exponents s_t that reproduce measured
distinct fractions at B = 4096:

- `kaggle`: the Criteo Kaggle sample's own column sizes, one exponent per column
  solved to match that column's distinct fraction (KAGGLE_SAMPLE_COLUMNS below).
- `terabyte`: the MLPerf v1 or DCNv2 table sizes (optionally scaled; tables under
  100 rows are kept whole), one exponent shared by all tables, solved so the mean
  distinct fraction over the 26 tables is 0.16 (real Terabyte rows, docs/design.md §5).

Solving takes well under a second (exact sums for the first 2^16 ids, a
geometric-grid integral for the tail of huge tables) and is cached.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from dlrmtrain.config.schema import SyntheticProfile, TerabyteTables, choices
from dlrmtrain.features import MLPERF_DCNV2_TABLE_SIZES, MLPERF_V1_TABLE_SIZES

PROFILES = choices(SyntheticProfile)
TERABYTE_TABLES = choices(TerabyteTables)
CALIBRATION_BATCH = 4096
TERABYTE_DISTINCT_FRACTION = 0.16
_KEEP_WHOLE_BELOW = 100

# Kaggle sample, per column C1..C26: (distinct values in the sample, distinct fraction at
# batch 4096 in file order), measured on the Criteo Kaggle sample at $DLRMTRAIN_SHARED_DATA
# (49,285 rows; docs/design.md §5).
KAGGLE_SAMPLE_COLUMNS: list[tuple[int, float]] = [
    (384, 0.0268), (492, 0.0774), (24440, 0.6464), (15130, 0.5051), (107, 0.0102), (11, 0.0019),
    (6511, 0.4717), (189, 0.0154), (4, 0.0007), (8111, 0.4162), (3435, 0.3380), (23041, 0.6210),
    (2623, 0.2915), (27, 0.0053), (4281, 0.3218), (19740, 0.5722), (10, 0.0022), (2208, 0.1972),
    (1070, 0.0824), (5, 0.0010), (21662, 0.5986), (12, 0.0018), (15, 0.0031), (8092, 0.3419),
    (48, 0.0086), (6213, 0.2561),
]
_EXACT_IDS = 1 << 16
_TAIL_POINTS = 4000


def _cdf(x: np.ndarray, n: int, s: float) -> np.ndarray:
    """CDF of the continuous bounded power law on [1, n + 1] with density ∝ x^-s."""
    if abs(s - 1.0) < 1e-9:
        return np.log(x) / np.log(n + 1.0)
    a = 1.0 - s
    return (np.power(x, a) - 1.0) / (np.power(n + 1.0, a) - 1.0)


def expected_distinct_fraction(n: int, s: float, batch: int = CALIBRATION_BATCH) -> float:
    """E[distinct ids] / batch for `batch` draws of `power_law_ids(n, s)`."""
    k_exact = np.arange(min(n, _EXACT_IDS), dtype=np.float64)
    p = _cdf(k_exact + 2.0, n, s) - _cdf(k_exact + 1.0, n, s)
    distinct = float(np.sum(-np.expm1(batch * np.log1p(-np.minimum(p, 1 - 1e-15)))))
    if n > _EXACT_IDS:  # tail: p(k) varies smoothly, integrate over a geometric grid of ids
        k = np.unique(np.geomspace(_EXACT_IDS, n, _TAIL_POINTS).astype(np.int64))
        p = _cdf(k + 2.0, n, s) - _cdf(k + 1.0, n, s)
        g = -np.expm1(batch * np.log1p(-p))
        distinct += float(np.sum((g[1:] + g[:-1]) * 0.5 * np.diff(k)))
    return distinct / batch


def solve_exponent(sizes: list[int], target: float, batch: int = CALIBRATION_BATCH) -> float:
    """The one exponent s >= 0 giving mean expected distinct fraction `target` over `sizes`."""
    def mean_fraction(s: float) -> float:
        return float(np.mean([expected_distinct_fraction(n, s, batch) for n in sizes]))

    lo, hi = 0.0, 64.0  # the fraction falls monotonically as s grows
    if mean_fraction(lo) < target:
        return 0.0  # even uniform ids repeat more than the target: the most spread possible
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if mean_fraction(mid) > target else (lo, mid)
    return 0.5 * (lo + hi)


@lru_cache(maxsize=None)
def kaggle_profile() -> tuple[list[int], list[float]]:
    sizes = [n for n, _ in KAGGLE_SAMPLE_COLUMNS]
    exponents = [solve_exponent([n], frac) for n, frac in KAGGLE_SAMPLE_COLUMNS]
    return sizes, exponents


def terabyte_sizes(tables: str = "v1", scale: float = 1.0) -> list[int]:
    if tables not in TERABYTE_TABLES:
        raise ValueError(f"terabyte tables must be one of {TERABYTE_TABLES}, got {tables!r}")
    if not 0 < scale <= 1:
        raise ValueError(f"scale must be in (0, 1], got {scale}")
    full = MLPERF_V1_TABLE_SIZES if tables == "v1" else MLPERF_DCNV2_TABLE_SIZES
    return [n if n < _KEEP_WHOLE_BELOW else max(_KEEP_WHOLE_BELOW, round(n * scale)) for n in full]


@lru_cache(maxsize=None)
def terabyte_profile(tables: str = "v1", scale: float = 1.0) -> tuple[list[int], list[float]]:
    sizes = terabyte_sizes(tables, scale)
    s = solve_exponent(sizes, TERABYTE_DISTINCT_FRACTION)
    return sizes, [s] * len(sizes)


def profile_tables(profile: str, tables: str = "v1", scale: float = 1.0) -> tuple[list[int], list[float]]:
    """(table sizes, per-table exponents) of a calibrated profile."""
    if profile == "kaggle":
        return kaggle_profile()
    if profile == "terabyte":
        return terabyte_profile(tables, scale)
    raise ValueError(f"profile must be 'kaggle' or 'terabyte' here, got {profile!r}")
