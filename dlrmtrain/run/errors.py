"""Problems a user can act on, each printed as one line by the entry point.

`SetupError`s stop a run before training starts (a run directory that holds or is
used by another run, a checkpoint trained with another config, data too small for
one step); every rank raises the same one and every rank exits 2. `RunError`s stop
a run that was training (a checkpoint or record that cannot be written, a signal):
the records are closed first, and the message says where the run stands.
"""

from __future__ import annotations

import signal

EXIT_USER_ERROR = 2
"""A setup or config problem: nothing was trained."""
EXIT_RUN_FAILED = 3
"""A run stopped by an error while training (e.g. a full disk); the error was printed."""


class SetupError(RuntimeError):
    """A run cannot start as configured; the message says why and what to change."""


class RunAlreadyFinished(SetupError):
    """A resumed run whose checkpoint is at its planned last step: nothing to train, every
    record left as it was (exit 0)."""

    exit_code = 0


class RunError(RuntimeError):
    """A run stopped while training; the message says why and where it stands."""

    exit_code = EXIT_RUN_FAILED


class CheckpointWriteError(RunError):
    """A checkpoint could not be written (full disk, I/O error, permission)."""


class RecordWriteError(RunError):
    """A record of the run (metrics.jsonl, summary.json, ...) could not be written."""


class RunInterrupted(RunError):
    """SIGTERM or SIGINT: the run stopped at a step boundary."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class DataError(RunError):
    """The run's data, read by a rank while training, is bad (an id beyond its table, a
    part file that disagrees with its manifest): the message names the file or table."""


class data_errors:  # noqa: N801 - used as a context manager, like contextlib's
    """Turn what the data layer raises for bad input (ValueError, OSError; each names its
    file or table) into `kind`: SetupError before the first step, DataError after.
    `wrap(iterable)` does the same for every item an iterator yields."""

    def __init__(self, kind: type[Exception]) -> None:
        self.kind = kind

    def __enter__(self) -> "data_errors":
        return self

    def __exit__(self, exc_type, exc, traceback) -> bool:
        if isinstance(exc, (ValueError, OSError)) and not isinstance(exc, self.kind):
            raise self.kind(str(exc)) from None
        return False

    def wrap(self, iterable):
        it = iter(iterable)
        while True:
            with self:
                item = next(it, _END)
            if item is _END:
                return
            yield item


_END = object()
