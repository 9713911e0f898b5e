"""Real multi-rank tests. `run_ranks` spawns Gloo ranks under a timeout."""

from tests.multiproc.harness import ranks_once_per_module, run_ranks

__all__ = ["ranks_once_per_module", "run_ranks"]
