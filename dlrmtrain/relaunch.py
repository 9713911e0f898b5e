"""Start a launch's ranks where its link says: on simulated nodes, behind a shaped
loopback, or on this machine's own loopback. One place for `dlrmtrain train` and the
scripts that start their own ranks (scripts/bench_train.py, profile_two_level.py)."""

from __future__ import annotations

import os
import subprocess

from dlrmtrain.launch import LaunchSpec, launch
from dlrmtrain.run.parent import OWNER_ENV
from dlrmtrain.testbed.shaped_link import LinkSpec, wrap_command
from dlrmtrain.testbed.sim_nodes import SimNodes, launch_nodes


def relaunch(spec: LaunchSpec, link: LinkSpec | SimNodes | None, rerun: list[str]) -> int:
    """Run `spec`'s ranks to completion and return the exit code.

    SimNodes: one torchrun agent per simulated node (`spec.nproc` ranks each). LinkSpec:
    `rerun` (the caller's own command less its link options, so it starts the ranks
    itself) again, inside the shaped namespace; that inner launcher stops when this one
    dies, even by kill -9 (run/parent.py). None: torchrun in this process."""
    if isinstance(link, SimNodes):
        return launch_nodes(spec, link)
    if link is not None:
        return subprocess.call(wrap_command(rerun, link),
                               env={**os.environ, OWNER_ENV: str(os.getpid())})
    return launch(spec)

