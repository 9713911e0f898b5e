"""`python -m tests.reliability.dying_rank POINT RANK ARGS...`: `dlrmtrain train --nproc 2
ARGS` through dlrmtrain's own launcher, whose rank RANK kills itself with SIGKILL (as
kill -9 or the OOM killer would) where POINT is: `build`, as the Trainer would shard its
model (its records begun, before the start barrier), `start`, as it would enter the
start barrier, `end`, as it would enter the end-of-run stats collective, `summary`, as
it would write the run's summary (after that collective, before its records are
complete), or `teardown`, as it would enter the final teardown barrier (its records
complete).
Every other rank runs unchanged and real: it meets a peer that died just there."""

from __future__ import annotations

import os
import signal
import sys


def _die(*_args, **_kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


class _DyingAtBarrier:
    """torch.distributed as the trainer sees it, but its one barrier (the start's) kills."""

    def __init__(self, dist) -> None:
        self._dist = dist

    def __getattr__(self, name: str):
        return _die if name == "barrier" else getattr(self._dist, name)


def main(argv: list[str]) -> int:
    point, rank, args = argv[0], int(argv[1]), argv[2:]
    if "RANK" not in os.environ:  # the launcher: this module again as every rank's program
        from dlrmtrain.launch import LaunchSpec, launch

        return launch(LaunchSpec(nproc=2, module="tests.reliability.dying_rank", args=argv))
    if int(os.environ["RANK"]) == rank:
        from dlrmtrain import trainer

        if point == "build":
            trainer.build_sharded_model = _die
        elif point == "start":
            trainer.dist = _DyingAtBarrier(trainer.dist)
        elif point == "end":
            trainer.collect_comm_stats = _die
        elif point == "summary":
            trainer.Trainer._end_run = _die
        elif point == "teardown":
            from dlrmtrain.distributed import env

            env.shutdown_distributed = _die  # train.main imports it when it runs
        else:
            raise SystemExit(f"dying_rank: unknown point {point!r}")
    from dlrmtrain.train import main as train

    return train(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
