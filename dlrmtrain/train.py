"""Entry point: `torchrun --nproc_per_node N -m dlrmtrain.train --config C [section.key=value ...]`.

A problem the user can fix before training (a config error, a run directory that
holds or is used by another run, a checkpoint trained with another config, too
little data, a bad data file, a device that is not there, tables too large for
memory) is printed once, by rank 0, and every rank exits with status 2, also when
only one rank found it (the ranks agree through the job's store: run/lifecycle.py). A run
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
from dlrmtrain.run.console import print_once
from dlrmtrain.run.errors import EXIT_USER_ERROR, RunAlreadyFinished, RunError, SetupError
from dlrmtrain.run.lifecycle import end_rank
from dlrmtrain.run.parent import stop_with_parent
from dlrmtrain.run.signals import install_stop_handlers
from dlrmtrain.validation import resolve_config, start_notes, validate_config


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
        print_once(f"config error: {e}")
        return EXIT_USER_ERROR
    for note in start_notes(loaded, cfg, int(os.environ.get("RANK", "0"))):
        print_once(note)

    # torch.fx warns once per rank about is_fx_tracing semantics; it is not ours.
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    from dlrmtrain.distributed.env import init_distributed, shutdown_distributed
    from dlrmtrain.run.machine import check_device
    from dlrmtrain.run.peers import start_heartbeat
    from dlrmtrain.trainer import Trainer  # heavy imports only after the config is good

    try:
        check_device(cfg.run.device)  # the same on every rank of this machine
    except SetupError as e:
        print_once(f"error: {e}")
        return EXIT_USER_ERROR
    env = init_distributed(cfg.run.device, timeout_s=cfg.run.collective_timeout_s)
    start_heartbeat(cfg.run.stall_warn_s)  # names a rank that goes silent (run/peers.py)
    try:
        trainer = Trainer(cfg, env)
    except RunAlreadyFinished as e:  # nothing to do: not an error
        print_once(f"dlrmtrain: {e}")
        shutdown_distributed()
        return e.exit_code
    except (SetupError, RunError) as e:  # agreed by every rank (a second stop signal while
        end_rank(e)  # building is a RunError); a peer may be gone already: no teardown
    try:
        trainer.train()
    except RunError as e:
        end_rank(e)
    trainer.close()
    lifecycle, step = trainer.lifecycle, trainer.step
    del trainer  # drop the sharded model before the process group goes away
    return lifecycle.finish(step, shutdown_distributed)


if __name__ == "__main__":
    sys.exit(main())
