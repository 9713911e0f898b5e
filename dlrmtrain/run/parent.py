"""A rank never outlives its launcher.

torchrun's agent (in `dlrmtrain train`, the launcher process itself) starts each
rank in a session of its own, so a launcher killed with SIGKILL leaves its ranks
running under PID 1, holding the CPUs (or GPUs) and `run.lock`. At start a rank
asks Linux to send it SIGHUP when its parent dies (`prctl(PR_SET_PDEATHSIG)`): the
run then stops at the next step boundary as on a first SIGTERM (signals.py). Linux
sends that signal again each time the rank is handed to another dying thread of
its parent, so it only ever asks for a stop, never "again". A watchdog thread backs this up: a rank whose parent has been gone for
`HARD_STOP_S` seconds (stuck where no step boundary comes) exits at once. While
the parent lives neither does anything: torchrun's own agent semantics are kept.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

from dlrmtrain.run.signals import request_stop

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_DEATH_SIGNAL = signal.SIGHUP  # "the controlling process died"
HARD_STOP_S = 20.0
"""Seconds a rank whose parent died may take to stop at a step boundary."""
EXIT_PARENT_GONE = 128 + signal.SIGKILL
_parent_at_start: int | None = None


def stop_with_parent() -> None:
    """Call first thing in a rank started by torchrun's agent (from the main thread): a
    stop request (SIGHUP) when the agent dies, and a hard exit `HARD_STOP_S` later. A
    process started otherwise (a world of one from a shell, perhaps under nohup) is
    left alone."""
    global _parent_at_start
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    _parent_at_start = os.getppid()
    signal.signal(PARENT_DEATH_SIGNAL, lambda signum, frame: request_stop(signum))
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, PARENT_DEATH_SIGNAL, 0, 0, 0)
    if parent_gone():  # died between the two calls above
        request_stop(PARENT_DEATH_SIGNAL)
    threading.Thread(target=_watch, name="parent-watchdog", daemon=True).start()


def parent_gone() -> bool:
    """Whether the process that started this one has died (this one was re-parented)."""
    return _parent_at_start is not None and os.getppid() != _parent_at_start


def _watch() -> None:
    while not parent_gone():
        time.sleep(0.5)
    time.sleep(HARD_STOP_S)
    print(f"dlrmtrain: rank {os.environ.get('RANK', '?')}: its launcher (pid "
          f"{_parent_at_start}) died and the run did not stop within {HARD_STOP_S:.0f} s; "
          f"exiting", file=sys.stderr, flush=True)
    os._exit(EXIT_PARENT_GONE)
