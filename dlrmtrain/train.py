"""Entry point: `torchrun --nproc_per_node N -m dlrmtrain.train --config C [section.key=value ...]`.

A problem the user can fix before training (a config error, a run directory that
holds or is used by another run, a checkpoint trained with another config, too
little data, a bad data file, a device that is not there, tables too large for
memory) is printed once, by rank 0, and every rank exits with status 2, also when
only one rank found it (the ranks agree through the job's store: Trainer). A run
stopped while training is one line too, after its records are closed: a signal
(`interrupted by SIGTERM at step N; last checkpoint step M`, exit 128 + signal) or
an error such as a checkpoint that cannot be written or bad data (exit 3). A peer lost
in the teardown after the run's records are complete is one line, and the exit stays 0.
"""

from __future__ import annotations

import logging
import os
import sys

from dlrmtrain.config import ConfigError, load_config, parse_cli
from dlrmtrain.run.errors import (EXIT_USER_ERROR, RunAlreadyFinished, RunError, RunInterrupted,
                                  SetupError)
from dlrmtrain.run.parent import stop_with_parent
from dlrmtrain.run.signals import install_stop_handlers
from dlrmtrain.validation import dedup_at_note, resolve_config, validate_config


def _print_once(message: str, by_rank: int = 0) -> None:
    if os.environ.get("RANK", "0") == str(by_rank):
        print(message, file=sys.stderr, flush=True)


def _stopped(error: RunError) -> None:
    """End a rank whose run stopped: its records are closed and its peers may be gone,
    so no teardown collective and no exit-time process-group teardown. A lost peer is
    named by the lowest rank left (rank 0 may be the one lost)."""
    from dlrmtrain.run.peers import stop_heartbeat

    stop_heartbeat()
    _print_once(str(error) if isinstance(error, RunInterrupted) else f"error: {error}",
                getattr(error, "reporting_rank", 0))
    sys.stdout.flush()
    os._exit(error.exit_code)


def _tear_down_finished(shutdown, cfg, run_id: str, step: int, last_checkpoint: int | None) -> int:
    """The final teardown barrier of a run that finished. A peer lost in it after rank 0
    said the run's records are complete (run/finished.py) is one line and changes nothing
    (no `stopped` record, exit 0); lost before that, it is a lost rank 0 as anywhere in the
    run. The process group is not destroyed then (a peer is gone: exit-time teardown aborts)."""
    from dlrmtrain.run.finished import finished_announced
    from dlrmtrain.run.peers import peer_failure

    try:
        shutdown()
    except Exception as e:  # noqa: BLE001 - a lost peer ends here; anything else is re-raised
        lost = peer_failure(e, step, last_checkpoint)
        if lost is None:
            raise
        if os.environ.get("RANK", "0") != "0" and not finished_announced():
            _record_lost_writer(cfg, run_id, step, lost)
            _stopped(lost)
        _print_once(f"dlrmtrain: {lost}; the run had finished and its records are complete",
                    lost.reporting_rank)
        sys.stdout.flush()
        os._exit(0)
    return 0


def _record_lost_writer(cfg, run_id: str, step: int, lost: RunError) -> None:
    """The `stopped` record of a run whose rank 0 was lost before its records were complete,
    by the rank that names it (run/teardown.py)."""
    from dlrmtrain.run.directory import run_dir_of
    from dlrmtrain.run.lock import RunLock
    from dlrmtrain.run.teardown import opened_as_writer, records_of_lost_writer, writes_for_lost_rank0

    if not writes_for_lost_rank0(lost, int(os.environ.get("RANK", "0"))):
        return
    records = records_of_lost_writer(run_dir_of(cfg), run_id, RunLock(run_dir_of(cfg)),
                                     lambda: opened_as_writer(cfg, run_id))
    if records is not None:
        records.stopped(step, str(lost), 0.0, 0, clock_running=False)
        records.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    install_stop_handlers()  # a signal from here on ends the run with one line
    stop_with_parent()  # ... and so does the death of torchrun's agent (the launcher)
    try:  # every config error surfaces before a process group exists
        path, overrides = parse_cli(argv)
        loaded = load_config(path, overrides)
        cfg = resolve_config(loaded)
        validate_config(cfg, world_size=int(os.environ.get("WORLD_SIZE", "1")))
    except ConfigError as e:  # the same on every rank: no rank waits for another
        _print_once(f"config error: {e}")
        return EXIT_USER_ERROR
    note = dedup_at_note(loaded, cfg)  # an unset comm.dedup_at kept at the owner, and why
    if note:
        _print_once(note)

    # torch.fx warns once per rank about is_fx_tracing semantics; it is not ours.
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    from dlrmtrain.distributed.env import init_distributed, shutdown_distributed
    from dlrmtrain.run.finished import announce_finished
    from dlrmtrain.run.machine import check_device
    from dlrmtrain.run.peers import start_heartbeat, stop_heartbeat
    from dlrmtrain.trainer import Trainer  # heavy imports only after the config is good

    try:
        check_device(cfg.run.device)  # the same on every rank of this machine
    except SetupError as e:
        _print_once(f"error: {e}")
        return EXIT_USER_ERROR
    env = init_distributed(cfg.run.device, timeout_s=cfg.run.collective_timeout_s)
    start_heartbeat(cfg.run.stall_warn_s)  # names a rank that goes silent (run/peers.py)
    try:
        trainer = Trainer(cfg, env)
    except RunAlreadyFinished as e:  # nothing to do: not an error
        _print_once(f"dlrmtrain: {e}")
        shutdown_distributed()
        return e.exit_code
    except SetupError as e:  # agreed by every rank (Trainer); a peer may be gone already,
        _print_once(f"error: {e}")  # so no teardown collective
        sys.stdout.flush()
        os._exit(EXIT_USER_ERROR)
    except RunError as e:  # a second stop signal while building
        _stopped(e)
    try:
        trainer.train()
    except RunError as e:
        _stopped(e)
    trainer.close()
    if env.is_main:  # its records are complete: a rank lost from here on changes nothing
        announce_finished()
    stop_heartbeat()  # a rank that is done is not silent
    run_id, step = trainer.checkpointer.run_id, trainer.step
    last_checkpoint = trainer.checkpointer.last_step
    del trainer  # drop the sharded model before the process group goes away
    return _tear_down_finished(shutdown_distributed, cfg, run_id, step, last_checkpoint)


if __name__ == "__main__":
    sys.exit(main())
