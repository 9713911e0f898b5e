"""SIGTERM and SIGINT end a run cleanly: at the next step boundary, with one line.

torchrun's agent forwards the signal it gets to every rank; a rank can also be
signalled by itself (a scheduler, `kill`). The first signal only asks the run to
stop: `Trainer.train` looks at `stop_signal()` after each step and, at the next
logging step, when every rank stops with it (run/stop.py), raises `RunInterrupted`
there, so every record up to that step is written. A second
signal stops at once (the same error, from wherever the rank is) — except inside
`stop_signals_held` (a checkpoint save): raised there it read as a write failure, and
a rank leaving a save's collectives strands its peers. It is held until the block
ends, then stops the run, the message naming both signals.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

from dlrmtrain.run.errors import RunInterrupted, signal_name

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_received: Optional[int] = None
_held: Optional[list[int]] = None  # inside stop_signals_held: the later signals, in order


def _handle(signum: int, frame) -> None:
    global _received
    if _received is not None and _held is not None:
        _held.append(signum)
        return
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


@contextmanager
def stop_signals_held(during: str, then: Callable[[], str]) -> Iterator[None]:
    """Hold a second stop signal until the block ends; then, if one came and the block
    ended normally, stop: `RunInterrupted` naming the signals, what they came `during`
    and (`then()`, asked at the end) where the run stands."""
    global _held
    outer, _held = _held, []
    try:
        yield
    finally:
        held, _held = _held, outer
    if held:
        assert _received is not None  # held only after a first one
        later = ", then ".join(signal_name(s) + (" again" if s == _received else "") for s in held)
        raise RunInterrupted(_received, f"interrupted by {signal_name(_received)}, then {later} "
                                        f"during {during}; stopped once it had ended; {then()}")


def stop_signal() -> Optional[int]:
    """The stop signal this process got, if any."""
    return _received
