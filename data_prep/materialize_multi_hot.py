"""Materialise MLPerf DCNv2 multi-hot days from one-hot data, as the MLPerf reference does.

    python data_prep/materialize_multi_hot.py --in /data/tb/mlperf_vocab --out /data/tb/multi_hot \
        --lookup-cache /data/tb/multi_hot_lookup

Writes TorchRec's layout: day_{i}_sparse_multi_hot.npz (keys "0".."25"), plus day_{i}_dense.npy
and day_{i}_labels.npy, readable with data.format: torchrec_multi_hot. Defaults: the DCNv2
table sizes and bag sizes (dlrmtrain/features.py, docs/design.md §1), seed 0 (the reference's). Finished days are skipped.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrmtrain.features import MLPERF_DCNV2_MULTI_HOT_SIZES, MLPERF_DCNV2_TABLE_SIZES  # noqa: E402
from dlrmtrain.data.preprocess.multi_hot import MultiHotLookup, materialize_day  # noqa: E402
from dlrmtrain.data.sources import DATA_FORMATS, open_parts  # noqa: E402


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--in", dest="src", required=True, help="one-hot dataset directory (any supported format)")
    ap.add_argument("--format", choices=DATA_FORMATS, default="auto")
    ap.add_argument("--out", required=True)
    ap.add_argument("--table-sizes", type=int_list, default=MLPERF_DCNV2_TABLE_SIZES)
    ap.add_argument("--multi-hot-sizes", type=int_list, default=MLPERF_DCNV2_MULTI_HOT_SIZES)
    ap.add_argument("--lookup-cache", help="keep the lookup tables memory-mapped here (~24 GB at MLPerf size)")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lookup = MultiHotLookup(args.table_sizes, args.multi_hot_sizes, cache_dir=args.lookup_cache)
    parts = open_parts(args.src, args.format)
    done = skipped = rows = 0
    for i, part in enumerate(tqdm(parts, desc="multi-hot days")):
        target = out / f"day_{i}_sparse_multi_hot.npz"
        if target.exists():
            skipped += 1
            continue
        block = part.read(0, part.rows)
        np.save(out / f"day_{i}_dense.npy", np.asarray(block.dense, dtype=np.float32))
        np.save(out / f"day_{i}_labels.npy", np.asarray(block.labels, dtype=np.int32).reshape(-1, 1))
        materialize_day(part, lookup, target)  # written last: its presence marks the day done
        done += 1
        rows += part.rows
    print(f"multi-hot: {done} days written ({rows:,} rows), {skipped} already done, into {out} "
          f"in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
