"""Test helpers: write raw Criteo text rows, and an independent pure-Python parse of them."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]


def shared_data_dir() -> Path:
    import os

    return Path(os.environ.get("DLRMTRAIN_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


def random_raw_lines(n: int, seed: int = 0, n_distinct: int = 50) -> list[str]:
    """Criteo-like lines: missing fields, negative and long dense values, skewed 8-hex categoricals."""
    rng = np.random.default_rng(seed)
    vocab = rng.integers(0, 2**32, size=(26, n_distinct), dtype=np.uint64)
    lines = []
    for _ in range(n):
        fields = [str(int(rng.integers(0, 2)))]
        for _ in range(13):
            kind = rng.integers(0, 10)
            if kind == 0:
                fields.append("")
            elif kind == 1:
                fields.append(str(-int(rng.integers(1, 5))))
            elif kind == 2:
                fields.append(str(int(rng.integers(10**8, 10**11))))  # 9-11 digits: the slow path
            else:
                fields.append(str(int(rng.integers(0, 1000))))
        for c in range(26):
            if rng.random() < 0.1:
                fields.append("")
            else:
                fields.append(f"{int(vocab[c, min(rng.zipf(1.5), n_distinct) - 1]):08x}")
        lines.append("\t".join(fields))
    return lines


def write_lines(path: Path, lines: list[str], gz: bool = False, trailing_newline: bool = True) -> Path:
    text = "\n".join(lines) + ("\n" if trailing_newline else "")
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def independent_parse(lines: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(labels [N], raw dense int64 [N, 13], raw categorical values int64 [N, 26]), missing = 0."""
    labels, dense, cats = [], [], []
    for line in lines:
        f = line.split("\t")
        assert len(f) == 40, line
        labels.append(int(f[0]))
        dense.append([int(x) if x else 0 for x in f[1:14]])
        cats.append([int(x, 16) if x else 0 for x in f[14:40]])
    return np.array(labels), np.array(dense, dtype=np.int64), np.array(cats, dtype=np.int64)


def expected_dense(raw_dense: np.ndarray) -> np.ndarray:
    return np.log1p(np.maximum(raw_dense, 0).astype(np.float32))


def expected_vocab_ids(cats_per_file: list[np.ndarray], hash_range: int) -> list[np.ndarray]:
    """Independent MLPerf remap: rank of (value % hash_range) among the column's distinct values."""
    hashed = [c % hash_range for c in cats_per_file]
    everything = np.concatenate(hashed)
    out = [np.zeros_like(h) for h in hashed]
    for col in range(26):
        distinct = np.unique(everything[:, col])
        for h, o in zip(hashed, out):
            o[:, col] = np.searchsorted(distinct, h[:, col])
    return out
