"""Entry point: `torchrun --nproc_per_node N -m dlrmtrain.train --config C [section.key=value ...]`."""

from __future__ import annotations

import logging
import os
import sys

from dlrmtrain.config import ConfigError, load_config, parse_cli
from dlrmtrain.validation import validate_config
from dlrmtrain.distributed.env import init_distributed, shutdown_distributed


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:  # every config error surfaces before a process group exists
        path, overrides = parse_cli(argv)
        cfg = load_config(path, overrides)
        validate_config(cfg, world_size=int(os.environ.get("WORLD_SIZE", "1")))
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2

    # torch.fx warns once per rank about is_fx_tracing semantics; it is not ours.
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    from dlrmtrain.trainer import Trainer  # heavy imports only after the config is good

    env = init_distributed(cfg.run.device)
    trainer = Trainer(cfg, env)
    summary = trainer.train()
    trainer.close()
    del trainer  # drop the sharded model before the process group goes away
    shutdown_distributed()
    del summary
    return 0


if __name__ == "__main__":
    sys.exit(main())
