"""The result table the prepared device checks print (gpu_check.py, gpu_check_attention.py):
one row a check, the pass/fail count last; torch-free, so a check script needs nothing more."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass


@dataclass
class Row:
    section: str
    check: str
    result: str
    detail: str = ""
    failed: bool = False


def print_table(rows: list[Row], out=sys.stdout) -> None:
    width = max(len(r.check) for r in rows)
    print(f"| {'section':<11} | {'check':<{width}} | {'result':<12} | detail", file=out)
    print(f"|{'-' * 13}|{'-' * (width + 2)}|{'-' * 14}|{'-' * 30}", file=out)
    for r in rows:
        print(f"| {r.section:<11} | {r.check:<{width}} | {r.result:<12} | {r.detail}", file=out)


def report(rows: list[Row], started: float) -> int:
    """Print the table and the count of passed checks since `started` (perf_counter); the exit
    status: 1 if any check failed."""
    print_table(rows)
    failed = [r for r in rows if r.failed]
    print(f"{len(rows) - len(failed)} of {len(rows)} checks passed in {time.perf_counter() - started:.1f} s"
          + (f"; FAILED: {', '.join(r.check for r in failed)}" if failed else ""))
    return 1 if failed else 0
