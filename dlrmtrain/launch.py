"""Start training processes with torchrun's own launcher, in this process.

`torchrun_argv(spec)` builds the argument list torchrun would get on its
command line (one place to add an option: a new `LaunchSpec` field and one
line here); `launch(spec)` hands it to `torch.distributed.run` and turns a
failed rank into its exit code and one line, instead of torchrun's traceback
(a rank killed by a signal: exit 3, as the ranks left end, naming it: run/peers.py; but
0 when rank 0 had said the run's records were complete: run/finished.py).
SIGTERM or SIGINT to the launcher reaches every rank (torchrun forwards it); the
ranks stop at a step boundary and rank 0 says where, so the launcher only exits
with 128 + the signal, quietly.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass, field

from dlrmtrain.run.errors import EXIT_RUN_FAILED, EXIT_USER_ERROR, signal_name
from dlrmtrain.run.finished import FINISHED_FILE_ENV, finished_file_exists
from dlrmtrain.run.parent import say_if_owner_gone

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

RANK_CPP_LOG_LEVEL = "ERROR"
"""The ranks' C++ log level (TORCH_CPP_LOG_LEVEL; one set in the environment wins). Its
warnings are not errors: the one a user sees is a TCPStore client's, ~25 lines of C++
frames per call, each time a rank asks the job's store in the instant its launcher dies
(after that no rank asks it: run/stop.py). Errors stay: C++ ERROR lines (NCCL's watchdog
among them) and every exception, which reaches Python with its message."""

RANK_MALLOC = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}
"""glibc malloc's settings for the ranks (one set in the environment wins): large blocks from
the heap, not mmap, and freed memory kept for the next step. glibc maps each block above its
mmap threshold (at most 32 MB) afresh and unmaps it when freed, so every such tensor of a CPU
step faults its pages in, zeroed by the kernel, each step: at MLPerf's shape (configs/
mini_mlperf_dim128.yaml, 2 ranks) the interaction's [4096, 27, 128] fp32 values and their
gradients are 56 MB each, and `none`'s step took 708 ms instead of 926-945 with these
settings (dedup at the source 651 instead of 733-764; scripts/bench_train.py). A rank's
memory stays at its peak; CUDA memory is not malloc's."""

# Hosts that mean "this machine": a rendezvous there needs no real network.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass
class LaunchSpec:
    """One torchrun agent: how many ranks here, and how to meet the other nodes."""

    nproc: int = 1
    """Ranks (processes) on this node."""
    nnodes: int = 1
    """Nodes (machines, or agents) in the job; 1 uses a standalone rendezvous."""
    node_rank: int = 0
    """This node's index in [0, nnodes)."""
    rdzv: str | None = None
    """HOST:PORT of the c10d rendezvous (multi-node only; every node gives the same)."""
    rdzv_id: str | None = None
    """Job id shared by all nodes (default: $SLURM_JOB_ID, else "dlrmtrain")."""
    local_addr: str | None = None
    """Address this node advertises to the others (default: 127.0.0.1 when the
    rendezvous is on this machine, else the host name torchrun picks)."""
    rdzv_is_host: bool | None = None
    """Whether this node's agent hosts the rendezvous store (default: torchrun's guess,
    true for any loopback address; simulated nodes, whose addresses are all loopback,
    say it: node 0 only)."""
    module: str = "dlrmtrain.train"
    """The Python module each rank runs (`python -m MODULE ARGS`)."""
    script: str | None = None
    """A Python file each rank runs instead of `module` (`python SCRIPT ARGS`)."""
    args: list[str] = field(default_factory=list)
    """Arguments of that module (e.g. --config C key=value ...)."""
    omp_threads: int | None = None
    """OMP_NUM_THREADS per rank (default: CPU cores / ranks here, at least 1)."""

    def check(self) -> None:
        """Raise ValueError naming the option for an impossible combination."""
        if self.nproc < 1:
            raise ValueError(f"--nproc must be at least 1, got {self.nproc}")
        if self.nnodes < 1:
            raise ValueError(f"--nnodes must be at least 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank {self.node_rank} is outside [0, {self.nnodes})")
        if self.nnodes > 1:
            if not self.rdzv:
                raise ValueError("--nnodes > 1 needs --rdzv HOST:PORT (the same on every node)")
            host, sep, port = self.rdzv.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"--rdzv {self.rdzv!r}: expected HOST:PORT")

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes


def default_omp_threads(nproc: int) -> int:
    """Share this machine's cores among its ranks (torchrun's own default is 1, with a banner)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // nproc)


def torchrun_argv(spec: LaunchSpec) -> list[str]:
    """The torchrun command line for `spec` (without the leading `torchrun`)."""
    argv = [f"--nproc-per-node={spec.nproc}", "--max-restarts=0"]
    if spec.nnodes == 1 and not spec.rdzv:
        argv.append("--standalone")  # c10d store on a free local port
    else:
        host = spec.rdzv.rpartition(":")[0]
        local_addr = spec.local_addr or ("127.0.0.1" if host in LOOPBACK_HOSTS else None)
        rdzv_id = spec.rdzv_id or os.environ.get("SLURM_JOB_ID", "dlrmtrain")
        argv += [f"--nnodes={spec.nnodes}", f"--node-rank={spec.node_rank}",
                 "--rdzv-backend=c10d", f"--rdzv-endpoint={spec.rdzv}", f"--rdzv-id={rdzv_id}"]
        if local_addr:
            argv.append(f"--local-addr={local_addr}")
        if spec.rdzv_is_host is not None:
            argv.append(f"--rdzv-conf=is_host={int(spec.rdzv_is_host)}")
    program = [spec.script] if spec.script else ["-m", spec.module]
    return [*argv, *program, *spec.args]


def _quiet_agent() -> None:
    """Silence torchrun's agent: its notes on a signal ("Received 15 death signal",
    "Sending process N closing signal") and on a failed rank repeat what rank 0 and
    `launch` say in one line. Each of its modules sets its own logger's level."""
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def _killed_rank(failures: dict) -> tuple[int, object] | None:
    """The lowest rank killed by a signal other than a stop signal (SIGKILL, a crash), if any.
    torchrun reports as first the failure it saw first; when the rank left ends (exit 3, having
    named the dead one) within the same poll as the kill, that can be the rank left."""
    for rank, failure in sorted(failures.items()):
        if failure.exitcode is not None and failure.exitcode < 0 and -failure.exitcode not in STOP_SIGNALS:
            return rank, failure
    return None


def launch(spec: LaunchSpec) -> int:
    """Run `spec` to completion; 0 on success, else the first failed rank's exit code."""
    spec.check()
    os.environ.setdefault("OMP_NUM_THREADS", str(spec.omp_threads or default_omp_threads(spec.nproc)))
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", RANK_CPP_LOG_LEVEL)
    for name, value in RANK_MALLOC.items():
        os.environ.setdefault(name, value)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    _quiet_agent()
    args = parse_args(torchrun_argv(spec))
    job_dir = tempfile.mkdtemp(prefix="dlrmtrain-job-")
    finished_file = os.environ[FINISHED_FILE_ENV] = os.path.join(job_dir, "finished")
    try:
        run(args)
    except SignalException as e:  # the ranks got the signal too and said where they stopped
        say_if_owner_gone()  # and why, when the runner above this launcher died
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        code = failure.exitcode if failure.exitcode and failure.exitcode > 0 else 1
        killed = _killed_rank(e.failures)
        if killed is not None and failure.exitcode > 0:  # a rank left ended first, in the same poll
            rank, failure = killed
        elif code in (EXIT_USER_ERROR, EXIT_RUN_FAILED) or code - 128 in STOP_SIGNALS:
            return code  # refused or stopped on purpose: rank 0 said why, in one line
        if failure.exitcode < 0:  # killed: the ranks left named it and closed the records
            signum = -failure.exitcode  # a SIGKILL leaves no words; a crash (SIGSEGV) may
            said = "" if signum == signal.SIGKILL else "; its output is above"
            if finished_file_exists(finished_file):  # a rank lost in the teardown barrier
                print(f"dlrmtrain: rank {rank} was killed by {signal_name(signum)} after the run "
                      f"had finished{said}; its records are complete", file=sys.stderr)
                return 0
            print(f"dlrmtrain: rank {rank} was killed by {signal_name(signum)}{said}",
                  file=sys.stderr)
            return EXIT_RUN_FAILED
        print(f"dlrmtrain: rank {rank} failed (exit code {failure.exitcode}); its output is "
              f"above", file=sys.stderr)
        return code
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
    return 0
