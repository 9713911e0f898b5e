"""Moved to dlrmtrain.testbed.shaped_link; this module only keeps the old command working:
`python -m dlrmtrain.distributed.shaped_link ARGS` runs `python -m dlrmtrain.testbed.shaped_link ARGS`
(the figures in docs/performance.md were recorded with the old form)."""

import sys

if __name__ == "__main__":
    from dlrmtrain.testbed.shaped_link import main

    print("dlrmtrain.distributed.shaped_link moved: running python -m dlrmtrain.testbed.shaped_link",
          file=sys.stderr, flush=True)
    sys.exit(main())
