"""A network testbed on one machine (root, network namespaces, tc): a shaped loopback
(shaped_link) and simulated nodes joined by a shaped link (sim_nodes), each with its
own command line; `dlrmtrain train --link-gbit / --sim-nodes` runs training in them."""

import importlib
import sys
from typing import NoReturn


def run_moved(old: str, new: str) -> NoReturn:
    """Keep `python -m OLD ARGS` working after a move: say on stderr where the command went,
    then exit with what `python -m NEW ARGS` returns (NEW's `main()`)."""
    print(f"{old} moved: running python -m {new}", file=sys.stderr, flush=True)
    sys.exit(importlib.import_module(new).main())
