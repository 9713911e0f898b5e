"""Which rank is silent, stalled or gone: a heartbeat through the job's store.

Each rank's daemon thread writes `{"beat", "step", "host", "pid"}` under its own key of
the job's store every `interval` seconds: no collective, and on the training thread only
an int assignment per step (`note_step`). A frozen process (SIGSTOP, a GIL held for
long) stops its thread with it, so a frozen rank is a silent key; a rank that waits in a
collective for a frozen peer keeps beating. Ranks 0 and 1 watch: one multi_get of every
key per interval; a rank whose value has not changed for `run.stall_warn_s` (on the
watcher's clock: hosts' clocks may differ) is named in one warning line, and in one more
when it beats again. Rank 1 speaks only while rank 0 is silent, so a stall is told once.

The stalled seconds (the union of every silence past stall_warn_s this rank saw, and of
its own: a thread that wakes up stall_warn_s late was frozen with its process) are kept
out of the training time in the run's summary (progress.py).

When a collective breaks (Gloo: a lost connection or a timeout; NCCL: the watchdog's
timeout or an aborted communicator), `peer_failure` turns the error into one `PeerFailure`
that names the ranks: those whose heartbeat stopped, with what this host sees of their
process (gone, stopped) when it runs here. Under torchrun the store lives in the
launcher's agent, so it outlives any rank; nothing asks it once the launcher is gone
(stop.job_store_address).
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading
import time
from typing import Optional

from dlrmtrain.run.errors import RunError
from dlrmtrain.run.stop import job_store_address, new_store_client

_KEY = "dlrmtrain/heartbeat"


def _key(rank: int) -> str:
    # a job torchrun restarts keeps its store: a restart must not read the last attempt's beats
    return f"{_KEY}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{rank}"


def heartbeat_interval(stall_warn_s: float) -> float:
    """Seconds between beats: six per stall_warn_s, at most 5 (one small write per rank)."""
    return min(5.0, max(0.1, stall_warn_s / 6))


def _say(line: str) -> None:
    from tqdm import tqdm  # above a progress bar of this process, not through it

    tqdm.write(f"dlrmtrain: {line}", file=sys.stderr)
    sys.stderr.flush()


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


class Heartbeat:
    """This rank's beat, and (on ranks 0 and 1) the watch over every rank's."""

    def __init__(self, rank: int, world_size: int, stall_warn_s: float,
                 address: tuple[str, int]) -> None:
        self.rank, self.world_size, self.stall_warn_s = rank, world_size, stall_warn_s
        self.address = address
        self.interval = heartbeat_interval(stall_warn_s)
        self.step = 0
        self.watching = rank in (0, 1)
        self._lock = threading.Lock()
        self._stalls: list[tuple[float, float]] = []     # closed silences (perf_counter)
        self._silent: dict[int, float] = {}              # named rank -> silent since
        self._seen: dict[int, tuple[Optional[bytes], float]] = {}  # rank -> (value, changed at)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    # ---- the thread ---------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()

    def _value(self, beat: int) -> str:
        return json.dumps({"beat": beat, "step": self.step, "host": socket.gethostname(),
                           "pid": os.getpid()})

    def _run(self) -> None:
        try:
            store = new_store_client(self.address)
        except Exception:  # noqa: BLE001 - no store, no heartbeat: the run goes on without
            return
        started = woke = time.perf_counter()
        self._seen = {r: (None, started) for r in range(self.world_size) if r != self.rank}
        beat = 0
        while not self._done.is_set():
            now = time.perf_counter()
            if now - woke > self.interval + self.stall_warn_s:  # this process was frozen
                self._add_stall(woke, now)
            woke = now
            if job_store_address() is None:  # the launcher (and its store) died
                return
            try:
                store.set(_key(self.rank), self._value(beat))
                if self.watching:
                    self._watch(store, now)
            except Exception:  # noqa: BLE001 - the store is gone: nothing left to watch
                return
            beat += 1
            self._done.wait(self.interval)

    def _read(self, store) -> dict[int, bytes]:
        peers = list(self._seen)
        keys = [_key(r) for r in peers]
        if store.check(keys):
            return dict(zip(peers, store.multi_get(keys)))
        return {r: store.get(k) for r, k in zip(peers, keys) if store.check([k])}

    def _watch(self, store, now: float) -> None:
        for rank, value in self._read(store).items():
            if value == self._seen[rank][0]:
                continue
            self._seen[rank] = (value, now)
            with self._lock:
                since = self._silent.pop(rank, None)
                if since is not None:
                    self._stalls.append((since, now))
            if since is not None and self._speaks():
                _say(f"rank {rank} answered again after {now - since:.0f} s silent (now at "
                     f"step {_step_of(value)}); training goes on")
        for rank, (value, changed_at) in self._seen.items():
            if rank in self._silent or now - changed_at <= self.stall_warn_s:
                continue
            with self._lock:
                self._silent[rank] = changed_at
            if self._speaks():
                where = (f"its last heartbeat at step {_step_of(value)}" if value is not None
                         else "no heartbeat yet")
                _say(f"warning: rank {rank} has been silent for {now - changed_at:.0f} s "
                     f"({where}); the job waits for it (run.stall_warn_s={self.stall_warn_s:g})")

    def _speaks(self) -> bool:
        return self.rank == 0 or 0 in self._silent

    def _add_stall(self, start: float, end: float) -> None:
        with self._lock:
            self._stalls.append((start, end))

    # ---- what the run reads -------------------------------------------------
    def stalled_seconds(self, start: float, end: float) -> float:
        """Seconds within [start, end] (perf_counter) in which some rank was silent past
        stall_warn_s, counting a silence still going on up to `end`."""
        now = time.perf_counter()
        with self._lock:
            spans = self._stalls + [(since, now) for since in list(self._silent.values())]
        return sum(max(0.0, min(e, end) - max(s, start)) for s, e in _merged(spans))

    def silent_peers(self, wait_s: float) -> dict[int, str]:
        """The ranks that do not beat (rank -> what this host sees of its process), read
        afresh for up to `wait_s`: a live rank beats within one interval. A rank on this
        host whose process is gone or stopped is known at once."""
        try:
            store = new_store_client(self.address)
        except Exception:  # noqa: BLE001 - the store is gone too: nothing to read
            return {}
        peers = [r for r in range(self.world_size) if r != self.rank]
        first = {r: _get(store, r) for r in peers}
        silent = {r: "" for r in peers}
        deadline = time.perf_counter() + wait_s
        while True:
            for r in list(silent):
                value = _get(store, r)
                if value is not None and value != first[r]:
                    del silent[r]
                    continue
                seen = _process_state(value)
                if seen:
                    silent[r] = seen
            undecided = [r for r, seen in silent.items() if not seen]
            if not undecided or time.perf_counter() > deadline:
                return silent
            time.sleep(min(0.2, self.interval / 2))


def _get(store, rank: int) -> Optional[bytes]:
    try:
        return store.get(_key(rank)) if store.check([_key(rank)]) else None
    except Exception:  # noqa: BLE001 - the store went away while asking
        return None


def _step_of(value: Optional[bytes]) -> str:
    try:
        return str(json.loads(value)["step"])
    except Exception:  # noqa: BLE001 - no beat yet
        return "?"


def _process_state(value: Optional[bytes]) -> str:
    """What this host sees of the process that wrote `value`: "its process is gone",
    "its process is stopped", or "" (another host's, or running)."""
    try:
        beat = json.loads(value)
    except Exception:  # noqa: BLE001 - no beat yet
        return ""
    if beat.get("host") != socket.gethostname():
        return ""
    try:
        with open(f"/proc/{int(beat['pid'])}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError, ValueError):
        return "its process is gone"
    return {"T": "its process is stopped", "t": "its process is stopped",
            "Z": "its process is gone", "X": "its process is gone"}.get(state, "")


# ---- one heartbeat per process ------------------------------------------------
_heartbeat: Optional[Heartbeat] = None


def start_heartbeat(stall_warn_s: float) -> None:
    """Start this rank's heartbeat (after the process group exists); nothing in a world of
    one, without a store, or with stall_warn_s 0."""
    global _heartbeat
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    address = job_store_address()
    if _heartbeat is not None or stall_warn_s <= 0 or address is None:
        return
    _heartbeat = Heartbeat(int(os.environ.get("RANK", "0")), world_size, stall_warn_s, address)
    _heartbeat.start()


def stop_heartbeat() -> None:
    if _heartbeat is not None:
        _heartbeat.stop()


def note_step(step: int) -> None:
    """The step this rank is at (read by its heartbeat thread)."""
    if _heartbeat is not None:
        _heartbeat.step = step


def stalled_seconds(start: float, end: float) -> float:
    """Seconds of [start, end] (perf_counter) in which a rank was silent (0 without a
    heartbeat)."""
    return _heartbeat.stalled_seconds(start, end) if _heartbeat is not None else 0.0


# ---- a collective that broke ----------------------------------------------------
# What Gloo and NCCL say when a peer is gone or does not answer (lower case): their own
# phrases, and plain socket words that count only in a backend's error.
_LOST_OWN = ("connection reset by peer", "connection closed by peer", "ncclremoteerror",
             "remote process exited", "communicator was aborted", "communicator is aborted")
_TIMEOUT_OWN = ("application timeout caused pair closure", "collective operation timeout")
_LOST_PLAIN = ("broken pipe", "connection refused", "socket closed")
_TIMEOUT_PLAIN = ("timed out", "timeout")
_BACKEND_WORDS = ("gloo", "nccl", "c10d", "processgroup")


class PeerFailure(RunError):
    """A collective broke because a peer is gone or does not answer; the message names it.
    `reporting_rank`: the lowest rank not named, the one that says it."""

    def __init__(self, message: str, lost: list[int]) -> None:
        super().__init__(message)
        self.lost = lost
        world = int(os.environ.get("WORLD_SIZE", "1"))
        self.reporting_rank = min((r for r in range(world) if r not in lost), default=0)


def _chain(error: BaseException):
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def backend_failure(error: BaseException) -> Optional[tuple[str, str]]:
    """("lost connection" | "timeout", the backend's own words) when `error` (or one it came
    from) is Gloo's or NCCL's report of a peer that is gone or does not answer, else None."""
    import torch.distributed as dist

    for e in _chain(error):
        if not isinstance(e, RuntimeError) or isinstance(e, RunError):
            continue
        text = str(e)
        low = text.lower()
        backend = isinstance(e, dist.DistError) or any(w in low for w in _BACKEND_WORDS)
        # NCCL's abort after its watchdog's timeout says both: the timeout is the news
        if any(w in low for w in _TIMEOUT_OWN):
            return "timeout", _backend_words(text)
        if any(w in low for w in _LOST_OWN) or backend and any(w in low for w in _LOST_PLAIN):
            return "lost connection", _backend_words(text)
        if backend and any(w in low for w in _TIMEOUT_PLAIN):
            return "timeout", _backend_words(text)
    return None


def _backend_words(text: str) -> str:
    """The backend's sentence without its source location and advice:
    `Read error [127.0.0.1]:24483: Connection reset by peer`."""
    first = text.strip().splitlines()[0] if text.strip() else text
    first = re.sub(r"^\[[^\]]*\.(cc|cpp|hpp|h):\d+\]\s*", "", first)
    return first.split(". This is typically")[0].strip()[:200]


def peer_failure(error: BaseException, step: int, last_checkpoint: Optional[int]
                 ) -> Optional[PeerFailure]:
    """The one-line error for a collective that broke because of a peer (None when
    `error` is not one): which ranks, what was seen, where the run stands."""
    found = backend_failure(error)
    if found is None:
        return None
    kind, words = found
    silent = _heartbeat.silent_peers(2 * _heartbeat.interval + 1) if _heartbeat else {}
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if not silent and world == 2:  # a world of two has one peer to lose
        silent = {1 - rank: ""}
    checkpoint = f"step {last_checkpoint}" if last_checkpoint is not None else "none"
    backend = "NCCL" if "nccl" in words.lower() or "nccl" in str(error).lower() else "Gloo"
    what = (f"a collective timed out ({backend}: {words})" if kind == "timeout"
            else f"the connection to it closed ({backend}: {words})")
    if silent:
        who = ", ".join(f"rank {r}" + (f" ({s})" if s else "") for r, s in sorted(silent.items()))
        verb = "stopped answering" if kind == "timeout" else (
            "was lost" if len(silent) == 1 else "were lost")
    else:  # the heartbeat names no one (none here, or every rank still beats)
        who, verb = "a peer", "stopped answering" if kind == "timeout" else "was lost"
    return PeerFailure(f"{who} {verb} at step {step}: {what}; last checkpoint {checkpoint}",
                       sorted(silent))
