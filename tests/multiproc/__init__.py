"""Real multi-rank tests. `run_ranks` spawns Gloo ranks under a timeout."""

from tests.multiproc.harness import run_ranks

__all__ = ["run_ranks"]
