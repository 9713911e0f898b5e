"""SIGTERM and SIGINT end a run cleanly: at the next step boundary, with one line.

torchrun's agent forwards the signal it gets to every rank; a rank can also be
signalled by itself (a scheduler, `kill`). The first signal only asks the run to
stop: `Trainer.train` looks at `stop_signal()` after each step and, at the next
logging step, when every rank stops with it (run/stop.py), raises `RunInterrupted`
there, so every record up to that step is written. A second
signal stops at once (the same error, from wherever the rank is).
"""

from __future__ import annotations

import signal
from typing import Optional

from dlrmtrain.run.errors import RunInterrupted, signal_name

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_received: Optional[int] = None


def _handle(signum: int, frame) -> None:
    global _received
    if _received is not None:  # named by the first: after a Ctrl-C, torchrun's agent escalates
        raise RunInterrupted(_received, f"interrupted by {signal_name(_received)} again; "
                                        f"stopped at once")  # a second one to SIGTERM
    _received = signum


def install_stop_handlers() -> None:
    """Catch the stop signals in this process (the main thread of a rank)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _handle)


def request_stop(signum: int) -> None:
    """Ask the run to stop at the next step boundary, as a first stop signal does; never
    "again" (for a signal that may come more than once, such as a parent's death)."""
    global _received
    if _received is None:
        _received = signum


def stop_signal() -> Optional[int]:
    """The stop signal this process got, if any."""
    return _received
