"""Preprocess raw Criteo day files (plain or .gz) into dlrmtrain's binary layout.

The same as `dlrmtrain preprocess` (see dlrmtrain/data/preprocess/cli.py):

    python data_prep/preprocess.py --out /data/criteo_tb --mode mlperf_vocab --workers 2 /raw/day_{0..23}.gz
    python data_prep/preprocess.py --out /data/kaggle_hash --mode hash --table-sizes 1000000 /raw/train.txt

Resumable: rerun the same command after an interruption; finished parts are skipped.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrmtrain.data.preprocess.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
