"""Readers for Criteo data in the formats users already hold, exposed as Parts.

- TorchRec (`torchrec/datasets/scripts/npy_preproc_criteo.py` and friends):
  `day_{i}_dense.npy` float32 [N, 13] (already log-transformed by TorchRec, used as
  stored), `day_{i}_sparse.npy` int32/int64 [N, 26], `day_{i}_labels.npy` int32 [N, 1].
- TorchRec / MLPerf DCNv2 multi-hot: `day_{i}_sparse_multi_hot.npz` with keys
  "0".."25", each int [N, k_t]; members must be stored uncompressed (np.savez, as
  the reference writes them) so they can be memory-mapped.
- facebookresearch MLPerf v1: `terabyte_processed_{train,test,val}.bin`, int32
  rows of 40 (label, 13 raw dense, 26 ids); dense gets log1p(max(x, 0)) at load.
"""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import numpy as np

from dlrmtrain.features import NUM_DENSE, NUM_SPARSE, log_transform_dense
from dlrmtrain.data.parts import RowBlock

FACEBOOK_ROW_INTS = 1 + NUM_DENSE + NUM_SPARSE


def _check_rows(path: Path, arr: np.ndarray, rows: int, cols: int | None) -> None:
    if arr.shape[0] != rows or (cols is not None and (arr.ndim != 2 or arr.shape[1] != cols)):
        want = f"[{rows}, {cols}]" if cols is not None else f"[{rows}, ...]"
        raise ValueError(f"{path}: shape {list(arr.shape)}, expected {want}")


def _load_npy(path: Path) -> np.ndarray:
    """Memory-map a .npy file; a truncated or corrupt one is an error naming it (numpy's
    own messages, e.g. "mmap length is greater than file size", name no file)."""
    try:
        return np.load(path, mmap_mode="c", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise ValueError(f"{path}: not a readable .npy array, truncated or corrupt ({e})") from None


class TorchRecDayPart:
    """One day of TorchRec's one-hot .npy layout."""

    def __init__(self, directory: str | Path, day: int) -> None:
        d = Path(directory)
        self.name = f"day_{day}"
        self.dense = _load_npy(d / f"day_{day}_dense.npy")
        self.rows = int(self.dense.shape[0])
        _check_rows(d / f"day_{day}_dense.npy", self.dense, self.rows, NUM_DENSE)
        self.labels = _load_npy(d / f"day_{day}_labels.npy").reshape(-1)
        _check_rows(d / f"day_{day}_labels.npy", self.labels, self.rows, None)
        self.sparse = self._load_sparse(d, day)

    def _load_sparse(self, d: Path, day: int) -> np.ndarray | list[np.ndarray]:
        sparse = _load_npy(d / f"day_{day}_sparse.npy")
        _check_rows(d / f"day_{day}_sparse.npy", sparse, self.rows, NUM_SPARSE)
        return sparse

    def read(self, start: int, stop: int) -> RowBlock:
        sparse = ([s[start:stop] for s in self.sparse] if isinstance(self.sparse, list)
                  else self.sparse[start:stop])
        return RowBlock(
            dense=np.asarray(self.dense[start:stop], dtype=np.float32),
            sparse=sparse,
            labels=self.labels[start:stop].astype(np.float32),
        )


def mmap_npz_member(path: str | Path, key: str) -> np.ndarray:
    """Memory-map one uncompressed member `key`.npy of an .npz file."""
    path = Path(path)
    with zipfile.ZipFile(path) as zf:
        try:
            info = zf.getinfo(f"{key}.npy")
        except KeyError:
            raise KeyError(f"{path}: no member {key!r} (has {sorted(zf.namelist())})") from None
        if info.compress_type != zipfile.ZIP_STORED:
            raise ValueError(f"{path}:{key}: member is compressed; re-save with np.savez (not savez_compressed)")
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        local_header = f.read(30)
        name_len, extra_len = struct.unpack("<HH", local_header[26:30])
        f.seek(info.header_offset + 30 + name_len + extra_len)
        version = np.lib.format.read_magic(f)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, fortran_order, dtype = read_header(f)
        offset = f.tell()
    return np.memmap(path, dtype=dtype, mode="c", offset=offset, shape=shape, order="F" if fortran_order else "C")


class TorchRecMultiHotPart(TorchRecDayPart):
    """One day of the DCNv2 multi-hot layout: dense/labels .npy + `day_{i}_sparse_multi_hot.npz`."""

    def _load_sparse(self, d: Path, day: int) -> list[np.ndarray]:
        path = d / f"day_{day}_sparse_multi_hot.npz"
        tables = [mmap_npz_member(path, str(t)) for t in range(NUM_SPARSE)]
        for t, table in enumerate(tables):
            _check_rows(Path(f"{path}:{t}"), table, self.rows, None)
            if table.ndim != 2:
                raise ValueError(f"{path}:{t}: expected [rows, k], got shape {list(table.shape)}")
        return tables


class FacebookBinPart:
    """One `terabyte_processed_{split}.bin` file of the facebookresearch MLPerf v1 pipeline."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        size = path.stat().st_size
        if size % (FACEBOOK_ROW_INTS * 4):
            raise ValueError(f"{path}: {size} bytes is not a whole number of {FACEBOOK_ROW_INTS}-int32 rows")
        self.rows = size // (FACEBOOK_ROW_INTS * 4)
        self.name = path.stem.replace("terabyte_processed_", "")
        self.data = (np.memmap(path, dtype="<i4", mode="c", shape=(self.rows, FACEBOOK_ROW_INTS))
                     if self.rows else np.zeros((0, FACEBOOK_ROW_INTS), np.int32))

    def read(self, start: int, stop: int) -> RowBlock:
        rows = self.data[start:stop]
        return RowBlock(
            dense=log_transform_dense(rows[:, 1 : 1 + NUM_DENSE]),
            sparse=rows[:, 1 + NUM_DENSE :],
            labels=rows[:, 0].astype(np.float32),
        )
