"""The project's on-disk layout for preprocessed Criteo data, its manifest and its reader.

    <root>/dataset.json            manifest: mode, table sizes, parts in order, row counts, checksums
    <root>/vocabulary.npz          MLPerf-vocabulary bitmaps (mode mlperf_vocab only)
    <root>/pass1/<part>.npz        per-file distinct values of the vocabulary pass (resumable)
    <root>/parts/<part>/dense.f32  float32 [rows, 13], already log1p(max(x, 0))
    <root>/parts/<part>/sparse.i32 int32 [rows, 26], contiguous ids per table
    <root>/parts/<part>/labels.u8  uint8 [rows]
    <root>/parts/<part>/part.json  rows, sha256 of each file, source file fingerprint

Raw little-endian arrays (no header) so a part can be written as a stream and
memory-mapped by any tool. A part is written under a temporary name and renamed
into place only when complete: a part directory with part.json is finished; an
interrupted one is never mistaken for finished and is redone on resume.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from dlrmtrain.features import NUM_DENSE, NUM_SPARSE
from dlrmtrain.data.parts import RowBlock
from dlrmtrain.data.formats.writes import atomic_output, write_failed

FORMAT_NAME = "dlrmtrain-criteo"
FORMAT_VERSION = 1
MANIFEST_NAME = "dataset.json"
PART_META_NAME = "part.json"
# file name -> (dtype, columns per row; 0 = one value per row)
PART_FILES: dict[str, tuple[np.dtype, int]] = {
    "dense.f32": (np.dtype("<f4"), NUM_DENSE),
    "sparse.i32": (np.dtype("<i4"), NUM_SPARSE),
    "labels.u8": (np.dtype("u1"), 0),
}


def source_fingerprint(path: str | Path) -> dict[str, Any]:
    """Identifies an input file cheaply (size + mtime) so resume can tell if it changed."""
    st = os.stat(path)
    return {"path": str(Path(path).resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def row_bytes(fname: str) -> int:
    """Bytes one row takes in a part's file `fname`."""
    dtype, cols = PART_FILES[fname]
    return dtype.itemsize * max(cols, 1)


PART_ROW_BYTES = sum(row_bytes(f) for f in PART_FILES)  # 157: all three files of one row


class PartWriter:
    """Streams rows into a part's temporary directory; `commit` renames it into place.

    A failed write raises `OutputWriteError` naming the file and the bytes written of the
    `expected_rows`' worth; the caller's `abort` removes the temporary directory."""

    def __init__(self, root: str | Path, name: str, expected_rows: int | None = None) -> None:
        self.final_dir = Path(root) / "parts" / name
        self.tmp_dir = Path(root) / "parts" / f".{name}.tmp-{os.getpid()}"
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        self.tmp_dir.mkdir(parents=True)
        self.name = name
        self.rows = 0
        self.expected_rows = expected_rows
        self._files = {fname: open(self.tmp_dir / fname, "wb") for fname in PART_FILES}
        self._hashes = {fname: hashlib.sha256() for fname in PART_FILES}
        self._written = dict.fromkeys(PART_FILES, 0)
        self._adopted: dict[str, str] = {}

    def _failed(self, fname: str, error: OSError, expected_rows: int | None = None) -> OSError:
        rows = self.expected_rows if expected_rows is None else expected_rows
        return write_failed(self.final_dir / fname, error, self._written[fname],
                            rows * row_bytes(fname) if rows else None,
                            removed=f"the unfinished part {self.tmp_dir.name}")

    def append(self, dense: np.ndarray, sparse: np.ndarray, labels: np.ndarray) -> None:
        self.append_file("dense.f32", dense)
        self.append_file("sparse.i32", sparse)
        self.append_file("labels.u8", labels)
        self.rows += len(labels)

    def append_file(self, fname: str, rows: np.ndarray) -> None:
        """Append rows to one file only (with `adopt` for the others; `commit` checks they agree)."""
        dtype, cols = PART_FILES[fname]
        arr = np.ascontiguousarray(rows, dtype=dtype)
        if arr.ndim != (2 if cols else 1) or (cols and arr.shape[1] != cols):
            raise ValueError(f"{self.name}/{fname}: bad shape {arr.shape}")
        data = arr.tobytes()
        try:
            self._files[fname].write(data)
        except OSError as e:
            raise self._failed(fname, e) from None
        self._written[fname] += len(data)
        self._hashes[fname].update(data)

    def adopt(self, fname: str, source: Path, sha256: str) -> None:
        """Take an already written, already checksummed file as this part's `fname`.

        Hard-linked, so the source stays intact until the caller deletes it after `commit`
        (an interruption in between loses nothing); copied where links are impossible.
        """
        self._files.pop(fname).close()
        self._hashes.pop(fname)
        target = self.tmp_dir / fname
        target.unlink()
        try:
            os.link(source, target)
        except OSError:
            try:
                shutil.copyfile(source, target)
            except OSError as e:
                self._written[fname] = target.stat().st_size if target.exists() else 0
                raise self._failed(fname, e, source.stat().st_size // row_bytes(fname)) from None
        self._adopted[fname] = sha256

    def commit(self, extra: dict[str, Any], rows: int | None = None) -> dict[str, Any]:
        """Close, check sizes, write part.json, and atomically move the part into place."""
        rows = self.rows if rows is None else rows
        for fname, f in self._files.items():
            try:  # a full disk may show only now (buffered and delayed writes)
                f.flush()
                os.fsync(f.fileno())
                f.close()
            except OSError as e:
                raise self._failed(fname, e, rows) from None
        for fname, (dtype, cols) in PART_FILES.items():
            size = (self.tmp_dir / fname).stat().st_size
            if size != rows * max(cols, 1) * dtype.itemsize:
                raise ValueError(f"{self.name}/{fname}: {size} bytes do not hold {rows} rows")
        sha = {**{k: h.hexdigest() for k, h in self._hashes.items()}, **self._adopted}
        meta = {"name": self.name, "rows": rows, "sha256": {k: sha[k] for k in PART_FILES}, **extra}
        try:
            (self.tmp_dir / PART_META_NAME).write_text(json.dumps(meta, indent=1))
        except OSError as e:
            raise write_failed(self.final_dir / PART_META_NAME, e, 0, None,
                               removed=f"the unfinished part {self.tmp_dir.name}") from None
        shutil.rmtree(self.final_dir, ignore_errors=True)
        os.rename(self.tmp_dir, self.final_dir)
        return meta

    def abort(self) -> None:
        for f in self._files.values():
            try:
                f.close()
            except OSError:  # the buffered rest of a file on a full disk: removed below anyway
                pass
        shutil.rmtree(self.tmp_dir, ignore_errors=True)


def finished_part_meta(root: str | Path, name: str) -> dict[str, Any] | None:
    """Metadata of a completed part, or None when it is missing or unfinished."""
    meta_path = Path(root) / "parts" / name / PART_META_NAME
    if not meta_path.exists():
        return None
    return json.loads(meta_path.read_text())


def write_manifest(root: str | Path, manifest: dict[str, Any]) -> None:
    path = Path(root) / MANIFEST_NAME
    with atomic_output(path) as tmp:
        tmp.write_text(json.dumps({"format": FORMAT_NAME, "version": FORMAT_VERSION, **manifest}, indent=1))


def read_manifest(root: str | Path) -> dict[str, Any]:
    path = Path(root) / MANIFEST_NAME
    if not path.exists():
        raise FileNotFoundError(f"{path}: no manifest; is this a preprocessed dlrmtrain dataset?")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT_NAME or manifest.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path}: format {manifest.get('format')} v{manifest.get('version')} is not "
                         f"{FORMAT_NAME} v{FORMAT_VERSION}")
    return manifest


def verify_part_checksums(root: str | Path, name: str) -> None:
    """Recompute a part's sha256 sums; raise naming the file that differs."""
    meta = finished_part_meta(root, name)
    if meta is None:
        raise FileNotFoundError(f"{root}/parts/{name}: part missing or unfinished")
    for fname, expected in meta["sha256"].items():
        digest = hashlib.sha256()
        with open(Path(root) / "parts" / name / fname, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
        if digest.hexdigest() != expected:
            raise ValueError(f"{root}/parts/{name}/{fname}: sha256 mismatch (file changed or corrupt)")


def verify_dataset_checksums(root: str | Path, rank: int = 0, world_size: int = 1,
                             max_bytes: float | None = None) -> bool:
    """Check the sha256 of every `world_size`-th part from `rank` on (ranks share the work).
    Returns False without reading when the dataset is over `max_bytes`; raises naming
    the file that differs."""
    root = Path(root)
    names = [p["name"] for p in read_manifest(root)["parts"]]
    size = sum(f.stat().st_size for n in names for f in (root / "parts" / n).iterdir())
    if max_bytes is not None and size > max_bytes:
        return False
    for name in names[rank::world_size]:
        verify_part_checksums(root, name)
    return True


class BinaryPart:
    """A memory-mapped part of the project's layout.

    Mapped copy-on-write ("c"): the file is never modified, and the arrays are
    writable so torch.from_numpy accepts them without a warning or a copy.
    """

    def __init__(self, root: str | Path, name: str, rows: int) -> None:
        self.name, self.rows = name, rows
        part_dir = Path(root) / "parts" / name
        self._arrays: dict[str, np.ndarray] = {}
        for fname, (dtype, cols) in PART_FILES.items():
            path = part_dir / fname
            expected = rows * max(cols, 1) * dtype.itemsize
            if path.stat().st_size != expected:
                raise ValueError(f"{path}: {path.stat().st_size} bytes, manifest implies {expected}")
            shape = (rows, cols) if cols else (rows,)
            self._arrays[fname] = (np.memmap(path, dtype=dtype, mode="c", shape=shape) if rows
                                   else np.zeros(shape, dtype))

    def read(self, start: int, stop: int) -> RowBlock:
        return RowBlock(
            dense=self._arrays["dense.f32"][start:stop],
            sparse=self._arrays["sparse.i32"][start:stop],
            labels=self._arrays["labels.u8"][start:stop].astype(np.float32),
        )


def open_binary_dataset(root: str | Path) -> tuple[dict[str, Any], list[BinaryPart]]:
    """Manifest and parts (in manifest order) of a preprocessed dataset."""
    manifest = read_manifest(root)
    parts = [BinaryPart(root, p["name"], p["rows"]) for p in manifest["parts"]]
    return manifest, parts
