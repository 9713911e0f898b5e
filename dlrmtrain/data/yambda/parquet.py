"""Reading Yambda's parquet files with pyarrow (an optional dependency: the `yambda` extra).

Yambda (huggingface.co/datasets/yandex/yambda) publishes `flat/{50m,500m,5b}/multi_event.parquet`
with one row per event: uid, timestamp (seconds, 5 s steps), item_id, is_organic,
event_type (listen / like / dislike / unlike / undislike), played_ratio_pct and
track_length_seconds (null for non-listens), and the catalog maps
`artist_item_mapping.parquet` (item_id, artist_id) and `album_item_mapping.parquet`
(item_id, album_id). Files are streamed by record batch, never loaded whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from dlrmtrain.data.yambda.events import EVENT_TYPE_MAP

EVENT_COLUMNS = ("uid", "timestamp", "item_id", "is_organic", "event_type", "played_ratio_pct")
"""multi_event.parquet columns the preprocessing reads (track_length_seconds is not used)."""
ARTIST_MAPPING_COLUMNS = ("item_id", "artist_id")
ALBUM_MAPPING_COLUMNS = ("item_id", "album_id")

PYARROW_HINT = "install it with `pip install 'dlrmtrain[yambda]'` (or `pip install pyarrow`)"


def require_pyarrow() -> Any:
    """The `pyarrow.parquet` module, or an ImportError that says how to install it."""
    try:
        import pyarrow.parquet as pq
    except ImportError as e:  # optional dependency
        raise ImportError(f"reading Yambda parquet files needs pyarrow: {PYARROW_HINT}") from e
    return pq


def open_parquet(path: Path, columns: Sequence[str]) -> Any:
    """A pyarrow ParquetFile whose schema has `columns`; errors name the file and what is missing."""
    pq = require_pyarrow()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such parquet file")
    pf = pq.ParquetFile(path)
    missing = [c for c in columns if c not in pf.schema_arrow.names]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; it has {pf.schema_arrow.names}")
    return pf


def _event_codes(column: Any, path: Path) -> np.ndarray:
    """uint8 event codes of an arrow event_type column (dictionary, string or integer)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    if pa.types.is_integer(column.type):
        raw = _numpy(column, np.int64, "event_type", path)
        bad = np.setdiff1d(np.unique(raw), list(EVENT_TYPE_MAP.values()))
        if bad.size:
            raise ValueError(f"{path}: column event_type has unknown code(s) {bad[:5].tolist()}; "
                             f"expected one of {EVENT_TYPE_MAP}")
        return raw.astype(np.uint8)
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    names = list(EVENT_TYPE_MAP)
    idx = pc.index_in(column, value_set=pa.array(names))
    if idx.null_count:
        bad = pc.unique(pc.filter(column, pc.is_null(idx))).to_pylist()[:5]
        raise ValueError(f"{path}: event_type has unknown value(s) {bad}; expected one of {names}")
    codes = np.array([EVENT_TYPE_MAP[n] for n in names], dtype=np.uint8)
    return codes[idx.to_numpy(zero_copy_only=False)]


def _numpy(column: Any, dtype: np.dtype, name: str, path: Path) -> np.ndarray:
    import pyarrow as pa
    t = column.type
    numeric = pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_temporal(t)
    if not (numeric or (np.dtype(dtype).kind == "f" and (pa.types.is_floating(t)
                                                        or pa.types.is_null(t)))):
        raise ValueError(f"{path}: column {name} holds {t} values, expected "
                         f"{'numbers' if np.dtype(dtype).kind == 'f' else 'integers'}")
    if column.null_count and np.dtype(dtype).kind != "f":
        raise ValueError(f"{path}: column {name} has {column.null_count} null value(s)")
    return column.to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def iter_event_batches(path: Path, batch_rows: int = 4_000_000) -> Iterator[dict[str, np.ndarray]]:
    """multi_event.parquet as numpy column dicts of up to `batch_rows` rows, in file order.

    uid, item_id: int64; timestamp: int64; event_type: uint8 codes; is_organic: uint8;
    played_ratio_pct: float32 with nulls (non-listens) as 0, as the reference's nan_to_num.
    """
    pf = open_parquet(path, EVENT_COLUMNS)
    for rb in pf.iter_batches(batch_size=batch_rows, columns=list(EVENT_COLUMNS)):
        cols = {name: rb.column(name) for name in EVENT_COLUMNS}
        ratio = _numpy(cols["played_ratio_pct"], np.float32, "played_ratio_pct", path)
        yield {
            "uid": _numpy(cols["uid"], np.int64, "uid", path),
            "timestamp": _numpy(cols["timestamp"], np.int64, "timestamp", path),
            "item_id": _numpy(cols["item_id"], np.int64, "item_id", path),
            "is_organic": _numpy(cols["is_organic"], np.uint8, "is_organic", path),
            "event_type": _event_codes(cols["event_type"], path),
            "played_ratio_pct": np.nan_to_num(ratio, nan=0.0),
        }


def read_mapping(path: Path, value_column: str) -> tuple[np.ndarray, np.ndarray]:
    """(item_id, artist_id or album_id) int64 columns of a catalog mapping file."""
    pf = open_parquet(path, ("item_id", value_column))
    table = pf.read(columns=["item_id", value_column])
    return (_numpy(table.column("item_id"), np.int64, "item_id", path),
            _numpy(table.column(value_column), np.int64, value_column, path))


def write_parquet(path: Path, columns: dict[str, Any]) -> None:
    """Write numpy / list columns as one parquet file (tests and tools build inputs with it)."""
    import pyarrow as pa
    pq = require_pyarrow()
    pq.write_table(pa.table(columns), str(path))
