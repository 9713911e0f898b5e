"""What a rank whose run cannot go on leaves behind (the error itself: run/failure.py).

A start that failed leaves nothing: the records a new run began are removed (a retry
then needs no run.overwrite), those of a resumed one closed. A run that stops after it
began training says so where a reader looks: a `stopped` line in metrics.jsonl, and an
`aborted` run_stop in mlperf.log. `FailureRecords` is the one place a failure path
writes to either log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from dlrmtrain.run.directory import RECORD_FILES


class FailureRecords:
    """The run's metrics records and MLPerf log as a failure path sees them: either may
    not be open yet (a start can fail before it opens them)."""

    def __init__(self, records: Optional[Any] = None, mlperf: Optional[Any] = None) -> None:
        self.records, self.mlperf = records, mlperf

    def stopped(self, step: int, reason: str, epochs_done: float, samples: int) -> None:
        """Record a stop after `step` (best effort: the records may be what failed)."""
        try:
            self.records.log("stopped", step=step, reason=reason)
            self.mlperf.run_stop("aborted", epochs_done, samples_count=samples)
        except Exception:  # noqa: BLE001 - the records themselves may be what failed
            pass

    def close(self) -> None:
        for opened in (self.records, self.mlperf):
            if opened is not None:
                opened.close()


def undo_start(opened: FailureRecords, run_dir: Path, remove_records: bool) -> None:
    """Close what a failed start opened; with `remove_records` (rank 0 of a new run) also
    delete the records it began in `run_dir`."""
    opened.close()
    if remove_records:
        for name in RECORD_FILES:
            (run_dir / name).unlink(missing_ok=True)
