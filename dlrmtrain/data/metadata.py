"""Data that configures itself: table sizes from the dataset's own metadata.

A dataset written by preprocessing (`dlrmtrain preprocess`) records its table
sizes (and, where present, multi-hot bag sizes) in `dataset.json`. A config
that leaves `data.table_sizes` (or `data.multi_hot_sizes`) null takes them from
there; one that gives sizes must give the dataset's, else the error names both.
Called by validate_config (dlrmtrain/validation.py), so it runs before any process starts and again in
every rank (each rank reads the same small file).
"""

from __future__ import annotations

from pathlib import Path

from dlrmtrain.config.loader import ConfigError
from dlrmtrain.config.schema import Config
from dlrmtrain.data.formats.binary import MANIFEST_NAME, read_manifest
from dlrmtrain.data.sources import detect_format
from dlrmtrain.features import NUM_SPARSE

SYNTHETIC_DEFAULT_ROWS = 1000
"""Rows per table of synthetic data (profile custom) when data.table_sizes is null."""


def dataset_manifest(cfg: Config) -> tuple[Path, dict] | None:
    """(path of dataset.json, its content) for a file dataset in dlrmtrain's layout, else None."""
    data = cfg.data
    if data.source != "criteo" or not data.path or not Path(data.path).is_dir():
        return None
    try:
        fmt = detect_format(data.path) if data.format == "auto" else data.format
    except (FileNotFoundError, ValueError):
        return None  # the loader reports what is wrong with the folder
    if fmt != "dlrmtrain":
        return None
    try:
        return Path(data.path) / MANIFEST_NAME, read_manifest(data.path)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"data.path: {e}") from None


def _agree(key: str, given: list[int], recorded: list[int], manifest: Path) -> None:
    if len(given) != len(recorded):
        raise ConfigError(f"{key}: the config gives {len(given)} entries but {manifest} records "
                          f"{len(recorded)}; leave {key} null to use the dataset's")
    for i, (g, r) in enumerate(zip(given, recorded)):
        if g != r:
            raise ConfigError(f"{key}[{i}]: the config gives {g} but {manifest} records {r}; "
                              f"leave {key} null to use the dataset's {recorded}")


def apply_dataset_metadata(cfg: Config) -> None:
    """Fill null data.table_sizes / data.multi_hot_sizes from dataset.json; check given ones."""
    data = cfg.data
    if data.source == "synthetic":
        if data.table_sizes is None:  # the generator's own sizes (profile), else its default
            from dlrmtrain.data.synthetic import generator

            data.table_sizes = (generator.tables_and_exponents(data)[0]
                                if data.synthetic.profile != "custom"
                                else [SYNTHETIC_DEFAULT_ROWS] * NUM_SPARSE)
        return
    found = dataset_manifest(cfg)
    if found is None:
        if data.table_sizes is None:
            where = (f"data.path {data.path!r} does not exist" if not Path(data.path or "").is_dir()
                     else f"data.path {data.path!r} has no {MANIFEST_NAME}")
            raise ConfigError(f"data.table_sizes: null takes the sizes from the dataset's "
                              f"{MANIFEST_NAME} (written by `dlrmtrain preprocess`), but {where}; "
                              f"prepare it first or give the {NUM_SPARSE} sizes")
        return
    manifest, content = found
    recorded = [int(n) for n in content["table_sizes"]]
    if data.table_sizes is None:
        data.table_sizes = recorded
    else:
        _agree("data.table_sizes", data.table_sizes, recorded, manifest)
    if content.get("multi_hot_sizes") is not None:
        bags = [int(k) for k in content["multi_hot_sizes"]]
        if data.multi_hot_sizes is None:
            data.multi_hot_sizes = bags
        else:
            _agree("data.multi_hot_sizes", data.multi_hot_sizes, bags, manifest)
