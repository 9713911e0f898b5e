"""Write calibrated synthetic Criteo-like data in dlrmtrain's binary layout.

    python data_prep/make_synthetic.py --profile kaggle --rows-per-part 1000000 --parts 4 --out data/syn_kaggle
    python data_prep/make_synthetic.py --profile terabyte --tables dcnv2 --scale 0.01 --out data/syn_tb

The result loads like preprocessed real data (data.source: criteo, data.path: OUT), with the
table sizes printed below. For tests and the quick start the same generator runs on the fly
(data.source: synthetic); see configs/data/synthetic*.yaml.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrmtrain.config.schema import DataConfig, SyntheticDataConfig  # noqa: E402
from dlrmtrain.data.synthetic.files import write_synthetic_dataset  # noqa: E402
from dlrmtrain.data.synthetic.profiles import PROFILES, TERABYTE_TABLES  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output dataset directory")
    ap.add_argument("--profile", choices=[p for p in PROFILES if p != "custom"], default="kaggle")
    ap.add_argument("--tables", choices=TERABYTE_TABLES, default="v1", help="profile terabyte: table sizes")
    ap.add_argument("--scale", type=float, default=1.0, help="profile terabyte: table size factor in (0, 1]")
    ap.add_argument("--rows-per-part", type=int, default=1 << 20)
    ap.add_argument("--parts", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    data = DataConfig(synthetic=SyntheticDataConfig(profile=args.profile, terabyte_tables=args.tables,
                                                    scale=args.scale))
    start = time.perf_counter()
    manifest = write_synthetic_dataset(data, args.out, args.rows_per_part, args.parts, args.seed)
    seconds = time.perf_counter() - start
    print(f"wrote {manifest['rows']:,} rows in {len(manifest['parts'])} parts to {args.out} "
          f"({seconds:.1f} s, profile {args.profile})")
    print(f"  table sizes (data.table_sizes): {manifest['table_sizes']}")


if __name__ == "__main__":
    main()
