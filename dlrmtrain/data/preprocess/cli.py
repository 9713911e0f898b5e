"""Command line of the preprocessing pipeline (`dlrmtrain preprocess`, data_prep/preprocess.py).

    dlrmtrain preprocess --out /data/criteo_tb --mode mlperf_vocab --workers 8 /raw/day_{0..23}.gz
    dlrmtrain preprocess --out /data/kaggle_hash --mode hash --table-sizes 1000000 /raw/train.txt

Raw Criteo day files (plain or .gz) → dlrmtrain's binary layout. Resumable:
rerun the same command after an interruption; finished parts are skipped.
Exit 2: bad input, --out in use, or too little free space for the estimated output
(refused before anything is written); exit 3: a write failed under way (the line names
the file and its sizes; temporary files are removed, finished parts kept).
"""

from __future__ import annotations

import argparse
import sys

from dlrmtrain.data.formats.criteo_text import BAD_LINE_POLICIES
from dlrmtrain.data.formats.writes import OutputWriteError
from dlrmtrain.data.preprocess.pipeline import preprocess
from dlrmtrain.data.preprocess.vocab import CATEGORICAL_MODES, MLPERF_HASH_RANGE
from dlrmtrain.features import NUM_SPARSE
from dlrmtrain.run.errors import EXIT_RUN_FAILED, SetupError


def parse_table_sizes(text: str) -> list[int]:
    sizes = [int(x) for x in text.split(",")]
    if len(sizes) == 1:
        return sizes * NUM_SPARSE
    if len(sizes) != NUM_SPARSE:
        raise argparse.ArgumentTypeError(f"give 1 or {NUM_SPARSE} comma-separated sizes, got {len(sizes)}")
    return sizes


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="raw day files (day_0 ... day_23, train.txt), plain or .gz")
    ap.add_argument("--out", required=True, help="output dataset directory")
    ap.add_argument("--mode", choices=CATEGORICAL_MODES, default="mlperf_vocab",
                    help="mlperf_vocab: hash mod --hash-range then contiguous ids (2 passes); hash: value %% size")
    ap.add_argument("--table-sizes", type=parse_table_sizes, help="mode hash: one size or 26 comma-separated")
    ap.add_argument("--hash-range", type=int, default=MLPERF_HASH_RANGE, help="mode mlperf_vocab: modulus")
    ap.add_argument("--bad-lines", choices=BAD_LINE_POLICIES, default="error",
                    help="error: stop at the first bad line (default); skip: skip, count and report them")
    ap.add_argument("--workers", type=int, default=1, help="files processed in parallel")
    args = ap.parse_args(argv)
    try:
        summary = preprocess(args.inputs, args.out, args.mode, args.table_sizes, args.hash_range,
                             args.bad_lines, args.workers)
    except OutputWriteError as e:  # a write failed under way (full disk): names file and sizes
        print(f"error: {e}", file=sys.stderr)
        return EXIT_RUN_FAILED
    except (ValueError, OSError, SetupError) as e:  # bad or unreadable input (the message
        print(f"error: {e}", file=sys.stderr)         # names the file), or --out in use
        return 2
    print(summary.render())
    return 0
