"""What one training step's activations take on a rank, by part: the bytes autograd keeps
for the backward (`saved`), what the forward's own frames still hold at its end (`held`),
and the scratch a part needs for a moment (`transient`).

Each family's model fills it in from the config and the rank's local batch, by formula
(models/dlrm_activations.py, models/hstu/activations.py: nothing is allocated, so the full
MLPerf sizes are sized on any machine); the memory check (run/machine.py, through the
family's Workload) and `dlrmtrain plan` add it to the tables and the dense state.

The peak: at the forward's end every part's saved and held bytes are alive at once (the
backward has freed nothing yet), and the one part working at that moment needs its scratch
too; parts run one after another, so their scratch never coexists. Hence
`peak = Σ saved + Σ held + max transient`. Nothing is allocated to size a step.
"""

from __future__ import annotations

from dataclasses import dataclass

FP32 = 4
BF16 = 2
INT64 = 8


def activation_bytes(precision: str) -> int:
    """Bytes per element of what a family runs under autocast (precision.py): bf16 or fp32."""
    return BF16 if precision == "bf16" else FP32


@dataclass(frozen=True)
class ActivationPart:
    name: str
    """As a refusal names it, e.g. "the attention (padded)"."""
    saved: int
    """Bytes of the tensors autograd keeps for the backward, every layer of the part together."""
    transient: int = 0
    """Scratch bytes the part needs beside everything saved, at its busiest moment."""
    held: int = 0
    """Bytes the forward's frames keep alive until its end beside the saved tensors
    (e.g. the looked-up rows a sequence model reads again and again)."""
    holds: str = ""
    """What the bytes are, for a message: "[B, H, N, N] scores and the mask, per layer"."""
    advice: str = ""
    """What makes the part smaller, as a refusal ends."""

    @property
    def peak(self) -> int:
        return self.saved + self.held + self.transient


@dataclass(frozen=True)
class ActivationMemory:
    parts: tuple[ActivationPart, ...]
    shape: str
    """The step it sizes, e.g. "local batch 1,024 × 4,096 rows, 3 STU layers, bf16"."""

    @property
    def saved(self) -> int:
        return sum(p.saved for p in self.parts)

    @property
    def peak(self) -> int:
        """Σ saved + Σ held + the largest transient (the module docstring says why)."""
        return (self.saved + sum(p.held for p in self.parts)
                + max((p.transient for p in self.parts), default=0))

    def largest(self) -> ActivationPart:
        """The part that needs the most (saved, held and its own scratch)."""
        return max(self.parts, key=lambda p: p.peak)

    def describe(self) -> str:
        """One line: the peak, what is kept (largest part first) and the largest scratch."""
        kept = sorted(self.parts, key=lambda p: -(p.saved + p.held))
        scratch = max(self.parts, key=lambda p: p.transient)
        return (f"{gib(self.peak)} at {self.shape}: kept "
                + ", ".join(f"{p.name} {gib(p.saved + p.held)}" for p in kept)
                + f"; scratch {gib(scratch.transient)} ({scratch.name})")


def gib(n: float) -> str:
    """Bytes as the memory messages print them: GB (2**30), or MB / KB for what would read 0.0 GB."""
    for unit, scale in (("GB", 2**30), ("MB", 2**20)):
        if n >= scale / 10:
            return f"{n / scale:,.1f} {unit}"
    return f"{n / 2**10:,.1f} KB"
