"""A rank never outlives its launcher, nor a launcher the runner that started it.

torchrun's agent (in `dlrmtrain train`, the launcher process itself) starts each
rank in a session of its own, so a launcher killed with SIGKILL leaves its ranks
running under PID 1, holding the CPUs (or GPUs) and `run.lock`. At start a rank
asks Linux to send it SIGHUP when its parent dies (`prctl(PR_SET_PDEATHSIG)`): the
run then stops at the next step boundary as on a first SIGTERM (signals.py). Linux
sends that signal again each time the rank is handed to another dying thread of
its parent, so it only ever asks for a stop, never "again". A watchdog thread backs this up: a rank whose parent has been gone for
`HARD_STOP_S` seconds (stuck where no step boundary comes) exits at once. While
the parent lives neither does anything: torchrun's own agent semantics are kept.

The launcher itself (`dlrmtrain train`) is left alone when a shell starts it (nohup
must keep working), but a program that starts it and must not be outlived by it (the
`dlrmtrain mlperf` runner) puts its own pid in `OWNER_ENV`. The launcher then asks
for SIGTERM when that owner dies (`stop_with_owner`): torchrun forwards it to every
rank, which stops at a step boundary with a `stopped` record. A watchdog ends the
launcher's whole process group if it is still there `OWNER_GONE_STOP_S` (60 s;
`DLRMTRAIN_OWNER_GONE_STOP_S` sets another) later.
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
OWNER_ENV = "DLRMTRAIN_OWNER_PID"
"""The pid of the process a launcher must not outlive (set by whoever starts it)."""
OWNER_DEATH_SIGNAL = signal.SIGTERM  # not SIGHUP: a runner under nohup passes SIG_IGN on
OWNER_GONE_STOP_S = 60.0
"""Seconds a launcher whose owner died may take to stop its ranks (torchrun gives them 30 s)."""
OWNER_GONE_STOP_ENV = "DLRMTRAIN_OWNER_GONE_STOP_S"
"""Another number of seconds for `OWNER_GONE_STOP_S` (a test sets it short)."""
_owner: int | None = None
_said = False


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


def stop_with_owner() -> None:
    """Call first thing in a launcher: when `OWNER_ENV` names the process that started it,
    SIGTERM when that process dies (at once if it already has), and a watchdog that ends
    this process group `OWNER_GONE_STOP_S` later. The variable is consumed: what this
    launcher starts watches it, not its owner."""
    global _owner
    owner = os.environ.pop(OWNER_ENV, "")
    if not owner.isdigit() or not sys.platform.startswith("linux"):
        return
    _owner = int(owner)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, OWNER_DEATH_SIGNAL, 0, 0, 0)
    if owner_gone():  # it died before the prctl above
        say_if_owner_gone()
        os.kill(os.getpid(), OWNER_DEATH_SIGNAL)
        return
    threading.Thread(target=_watch_owner, name="owner-watchdog", daemon=True).start()


def owner_gone() -> bool:
    """Whether this launcher's owner (`stop_with_owner`) has died."""
    return _owner is not None and os.getppid() != _owner


def say_if_owner_gone() -> None:
    """One line, once, when the owner's death is why this launcher stops."""
    global _said
    if owner_gone() and not _said:
        _said = True
        print(f"dlrmtrain: the process that started this run (pid {_owner}) died; the run "
              f"stops", file=sys.stderr, flush=True)


def owner_gone_stop_s() -> float:
    """`OWNER_GONE_STOP_S`, or the positive number of seconds `OWNER_GONE_STOP_ENV` gives."""
    try:
        seconds = float(os.environ.get(OWNER_GONE_STOP_ENV, ""))
    except ValueError:
        return OWNER_GONE_STOP_S
    return seconds if seconds > 0 else OWNER_GONE_STOP_S


def _watch_owner() -> None:
    grace = owner_gone_stop_s()
    while not owner_gone():
        time.sleep(0.5)
    say_if_owner_gone()
    time.sleep(grace)
    print(f"dlrmtrain: the run did not stop within {grace:g} s of its owner's "
          f"death; ending it", file=sys.stderr, flush=True)
    if os.getpgrp() == os.getpid():  # a group of its own (the runner starts it so)
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os._exit(EXIT_PARENT_GONE)
