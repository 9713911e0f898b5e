"""Open a dataset directory in any supported format as an ordered list of Parts."""

from __future__ import annotations

import re
from pathlib import Path

from dlrmtrain.config.schema import DataFormat, choices
from dlrmtrain.data.formats.binary import MANIFEST_NAME, open_binary_dataset
from dlrmtrain.data.formats.foreign import FacebookBinPart, TorchRecDayPart, TorchRecMultiHotPart
from dlrmtrain.data.parts import Part

DATA_FORMATS = choices(DataFormat)
FACEBOOK_SPLITS = ("train", "test", "val")


def _days(directory: Path, suffix: str) -> list[int]:
    pattern = re.compile(rf"day_(\d+){re.escape(suffix)}$")
    return sorted(int(m.group(1)) for p in directory.iterdir() if (m := pattern.match(p.name)))


def detect_format(directory: str | Path) -> str:
    d = Path(directory)
    if (d / MANIFEST_NAME).exists():
        return "dlrmtrain"
    if _days(d, "_sparse_multi_hot.npz"):
        return "torchrec_multi_hot"
    if _days(d, "_sparse.npy"):
        return "torchrec"
    if any((d / f"terabyte_processed_{s}.bin").exists() for s in FACEBOOK_SPLITS):
        return "facebook_bin"
    raise FileNotFoundError(
        f"{d}: no {MANIFEST_NAME}, day_*_sparse.npy, day_*_sparse_multi_hot.npz or terabyte_processed_*.bin found"
    )


def open_parts(directory: str | Path, data_format: str = "auto") -> list[Part]:
    """All parts of a dataset in their natural order (day 0, 1, ...; train, test, val)."""
    d = Path(directory)
    if not d.is_dir():
        raise FileNotFoundError(f"{d}: dataset directory does not exist")
    fmt = detect_format(d) if data_format == "auto" else data_format
    if fmt == "dlrmtrain":
        return list(open_binary_dataset(d)[1])
    if fmt == "torchrec":
        return [TorchRecDayPart(d, day) for day in _days(d, "_sparse.npy")]
    if fmt == "torchrec_multi_hot":
        return [TorchRecMultiHotPart(d, day) for day in _days(d, "_sparse_multi_hot.npz")]
    if fmt == "facebook_bin":
        return [FacebookBinPart(d / f"terabyte_processed_{s}.bin") for s in FACEBOOK_SPLITS
                if (d / f"terabyte_processed_{s}.bin").exists()]
    raise ValueError(f"unknown data format {data_format!r}; expected one of {DATA_FORMATS}")
