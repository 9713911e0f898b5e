"""Moved to dlrmtrain.testbed.sim_nodes; this module only keeps the old command working:
`python -m dlrmtrain.distributed.sim_nodes ARGS` runs `python -m dlrmtrain.testbed.sim_nodes ARGS`
(the figures in docs/performance.md were recorded with the old form)."""

import sys

if __name__ == "__main__":
    from dlrmtrain.testbed.sim_nodes import main

    print("dlrmtrain.distributed.sim_nodes moved: running python -m dlrmtrain.testbed.sim_nodes",
          file=sys.stderr, flush=True)
    sys.exit(main())
