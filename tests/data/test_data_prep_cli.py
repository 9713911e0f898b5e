"""The data_prep command lines end to end on small inputs."""

from __future__ import annotations

import importlib.util

import numpy as np
import torch

from dlrmtrain.data.loader import CriteoBatchLoader, CriteoLoaderSpec
from dlrmtrain.data.preprocess.multi_hot import MultiHotLookup, MultiHotPart
from dlrmtrain.data.sources import detect_format, open_parts
from tests.data.raw_rows import REPO_ROOT, random_raw_lines, write_lines


def load_cli(name):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "data_prep" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_preprocess_cli_prints_summary_with_bad_lines(tmp_path, capsys):
    lines = random_raw_lines(40, seed=7)
    lines.insert(10, "not\ta\tcriteo\tline")
    raw = write_lines(tmp_path / "day_0.gz", lines, gz=True)
    load_cli("preprocess").main([str(raw), "--out", str(tmp_path / "out"), "--mode", "hash",
                                 "--table-sizes", "1000", "--bad-lines", "skip"])
    out = capsys.readouterr().out
    assert "rows:  40 total" in out and "bad lines skipped: 1" in out and "day_0.gz:11" in out
    assert open_parts(tmp_path / "out")[0].rows == 40


def test_make_synthetic_then_materialize_multi_hot(tmp_path, capsys):
    load_cli("make_synthetic").main(["--out", str(tmp_path / "syn"), "--rows-per-part", "3000", "--parts", "2"])
    assert "wrote 6,000 rows in 2 parts" in capsys.readouterr().out
    parts = open_parts(tmp_path / "syn")
    assert [p.rows for p in parts] == [3000, 3000]
    batch = next(iter(CriteoBatchLoader(parts, CriteoLoaderSpec(1024))))
    assert batch.dense_features.shape == (1024, 13) and set(batch.labels.unique().tolist()) <= {0.0, 1.0}

    sizes = [int(s) for s in (np.asarray(parts[0].read(0, 3000).sparse).max(0) + 1)]
    bags = [1 + t % 4 for t in range(26)]
    load_cli("materialize_multi_hot").main([
        "--in", str(tmp_path / "syn"), "--out", str(tmp_path / "mh"),
        "--table-sizes", ",".join(map(str, sizes)), "--multi-hot-sizes", ",".join(map(str, bags))])
    assert detect_format(tmp_path / "mh") == "torchrec_multi_hot"
    on_disk = next(iter(CriteoBatchLoader(open_parts(tmp_path / "mh")[1:], CriteoLoaderSpec(512))))
    on_the_fly = next(iter(CriteoBatchLoader([MultiHotPart(parts[1], MultiHotLookup(sizes, bags))], CriteoLoaderSpec(512))))
    assert torch.equal(on_disk.sparse_features.values(), on_the_fly.sparse_features.values())
    assert torch.equal(on_disk.dense_features, on_the_fly.dense_features)
    assert torch.equal(on_disk.labels, on_the_fly.labels)
