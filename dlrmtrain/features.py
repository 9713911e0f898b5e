"""The Criteo feature layout every layer shares: column counts, feature and table names,
the dense transform, the MLPerf table sizes.

A leaf module (numpy only), so the config schema, the data modules, the model and the
scripts all read this one definition without importing each other.
"""

from __future__ import annotations

import numpy as np

NUM_DENSE = 13
NUM_SPARSE = 26
# Raw text columns: label, I1..I13, C1..C26.
NUM_TEXT_FIELDS = 1 + NUM_DENSE + NUM_SPARSE
# Same as torchrec.datasets.criteo.DEFAULT_CAT_NAMES (spelled out so data prep needs no torch).
CAT_KEYS: list[str] = [f"cat_{i}" for i in range(NUM_SPARSE)]
# Embedding table of each categorical feature (the names configs use: sharding.tables, ...).
TABLE_NAMES: list[str] = [f"t_{key}" for key in CAT_KEYS]
TEXT_FIELD_NAMES: list[str] = (
    ["label"] + [f"I{i}" for i in range(1, NUM_DENSE + 1)] + [f"C{i}" for i in range(1, NUM_SPARSE + 1)]
)


def log_transform_dense(raw: np.ndarray) -> np.ndarray:
    """Dense transform of the MLPerf references: negatives (and missing) to 0, then log(x + 1).

    Applied once, at preprocessing time, so the loader only copies float32.
    """
    clipped = np.maximum(raw, 0).astype(np.float32)
    return np.log1p(clipped, out=clipped)


# MLPerf table sizes (docs/design.md §1). v1: the distinct counts of the 40M-hash vocabulary on
# Criteo Terabyte; DCNv2: the same capped at 40M as the DCNv2 reference configures them.
MLPERF_V1_TABLE_SIZES: list[int] = [
    39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10,
    2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36,
]
MLPERF_DCNV2_TABLE_SIZES: list[int] = [
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
]
MLPERF_DCNV2_MULTI_HOT_SIZES: list[int] = [
    3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1,
]
