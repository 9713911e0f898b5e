"""Run a function on N real ranks (separate processes, Gloo) under a timeout.

Used by every multi-rank test. A rank that raises, crashes or hangs fails the
test with that rank's traceback; no rank's failure is ever passed over.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import socket
import time
import traceback
from typing import Any, Callable

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(fn, rank, world_size, port, args, queue) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    import torch
    import torch.distributed as dist

    from dlrmtrain.distributed.env import shutdown_distributed

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        result = fn(rank, world_size, *args)
        shutdown_distributed()
        # Serialise to bytes: torch would otherwise share tensors through
        # shared-memory handles that die with this process.
        buffer = io.BytesIO()
        torch.save(result, buffer)
        queue.put((rank, "ok", buffer.getvalue()))
    except BaseException:  # report every failure to the parent
        queue.put((rank, "error", traceback.format_exc()))
        raise


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any,
              timeout: float = 240.0) -> list[Any]:
    """Call `fn(rank, world_size, *args)` on each rank; return results by rank.

    `fn` must be importable (module level) because ranks are spawned.
    Results must be picklable (tensors are fine). The free port is picked
    before the ranks bind it, so another process can take it in between:
    that one failure (EADDRINUSE) is retried once on a new port.
    """
    try:
        return _run_ranks_once(fn, world_size, args, timeout)
    except RuntimeError as e:
        if "EADDRINUSE" not in str(e) and "address already in use" not in str(e):
            raise
        return _run_ranks_once(fn, world_size, args, timeout)


def ranks_once_per_module(fn: Callable[..., Any], folder: str, timeout: float, world_size: int = 2):
    """A module-scoped fixture that runs `fn(rank, world_size, out_dir)` once on real ranks in a
    fresh folder `folder` and gives (rank 0's result, that folder): a spawn costs as much as a
    short run, so a module's tests share one."""

    @pytest.fixture(scope="module")
    def fixture(tmp_path_factory):
        out = tmp_path_factory.mktemp(folder)
        return run_ranks(fn, world_size, str(out), timeout=timeout)[0], out

    return fixture


PRELOADED = ("torch", "torch.distributed", "torchrec", "torchrec.distributed.embeddingbag",
             "torchrec.distributed.embedding", "fbgemm_gpu")
"""imported once by the fork server, so each rank starts without importing them again
(seconds of CPU per rank on two shared cores; the fork server itself is single-threaded)"""


def _rank_context() -> mp.context.BaseContext:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOADED))
    return ctx


def _run_ranks_once(fn: Callable[..., Any], world_size: int, args: tuple,
                    timeout: float) -> list[Any]:
    ctx = _rank_context()
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(fn, r, world_size, port, args, queue))
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) + len(errors) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"ranks {sorted(set(range(world_size)) - set(results) - set(errors))} "
                    f"did not finish within {timeout:.0f}s; errors so far: {errors}")
            try:
                rank, status, payload = queue.get(timeout=min(remaining, 1.0))
            except Exception:  # queue.Empty: check for ranks that died silently
                dead = [r for r, p in enumerate(procs)
                        if p.exitcode not in (None, 0) and r not in errors and r not in results]
                if dead:
                    time.sleep(0.5)  # let a traceback already in the queue arrive
                    if queue.empty():
                        raise RuntimeError(
                            f"rank(s) {dead} died with exit codes "
                            f"{[procs[r].exitcode for r in dead]} and no report")
                continue
            if status == "ok":
                import torch

                results[rank] = torch.load(io.BytesIO(payload), weights_only=False)
            else:
                errors[rank] = payload
            if errors:
                break
        if errors:
            raise RuntimeError("\n".join(f"--- rank {r} failed ---\n{tb}"
                                         for r, tb in sorted(errors.items())))
        for p in procs:
            p.join(timeout=max(1.0, deadline - time.monotonic()))
        bad = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode != 0}
        if bad:
            raise RuntimeError(f"ranks exited abnormally after reporting: {bad}")
        return [results[r] for r in range(world_size)]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
