"""DLRMv4's parameter count and per-sample FLOPs, from its config alone (nothing is
allocated: the full model's tables hold ~150 G parameters; the counts and what each
one covers: dlrmtrain/models/hstu/size.py).

    python scripts/hstu_size.py --config configs/mlperf_dlrmv4.yaml [key=value ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dlrmtrain.config import load_config  # noqa: E402
from dlrmtrain.models.hstu.size import describe, model_size  # noqa: E402
from dlrmtrain.workloads import workload_of  # noqa: E402
from dlrmtrain.workloads.dlrmv4 import DLRMV4  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="a dlrmv4_hstu YAML config")
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides")
    args = parser.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    if workload_of(cfg) is not DLRMV4:  # the command asks the family, as every entry point
        parser.error(f"{args.config}: model.arch is {cfg.model.arch!r}, not {DLRMV4.arch}")
    print(describe(cfg, model_size(cfg)))


if __name__ == "__main__":
    main()
