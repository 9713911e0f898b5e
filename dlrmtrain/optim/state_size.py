"""How much state the optimizers keep, in fp32 values: the embedding tables' fused
optimizer per row and per element, the dense optimizer per parameter; what the memory
check (run/machine.py) adds to the weights.

The tables are updated by fbgemm's fused kernel inside the backward pass; which kernel an
`optim` section gets is fused.fused_params's choice, so the size is read
from that kernel, not from `optim.name` a second time: EXACT_SGD keeps nothing,
EXACT_ADAGRAD one accumulator per element (a table's size again), EXACT_ROWWISE_ADAGRAD
(`optim.name: adam`'s tables, as the DLRMv4 reference) one accumulator per row.
tests/optim/test_state_size.py checks each against the state fbgemm allocates. The dense
optimizer's is counted on the optimizer itself (optimizers.dense_state_per_parameter).
"""

from __future__ import annotations

from dataclasses import dataclass

from dlrmtrain.config.schema import OptimConfig


@dataclass(frozen=True)
class TableOptimizerState:
    """fp32 values the fused optimizer keeps for a table: `per_row` per row plus
    `per_element` per weight."""

    optim_name: str
    kernel: str
    """fbgemm's name for the kernel (EmbOptimType)."""
    per_row: int
    per_element: int

    def values(self, rows: int, width: int) -> int:
        return rows * (self.per_row + self.per_element * width)

    def describe(self) -> str:
        """What the memory check's message says of it."""
        kept = [f"one fp32 per {what}" for n, what in ((self.per_row, "row"), (self.per_element, "weight"))
                if n == 1] + [f"{n} fp32 per {what}" for n, what in ((self.per_row, "row"),
                                                                      (self.per_element, "weight")) if n > 1]
        return f"optim.name {self.optim_name}: fbgemm's {self.kernel}, {' and '.join(kept) or 'none'}"


_STATE_OF_KERNEL = {"exact_sgd": (0, 0), "exact_adagrad": (0, 1), "exact_row_wise_adagrad": (1, 0)}


def table_optimizer_state(optim: OptimConfig) -> TableOptimizerState:
    """The fused table optimizer's state for `optim` (any precision and device: the
    state is fp32 in every case, precision.py)."""
    from dlrmtrain.optim.fused import fused_params  # fbgemm: imported only when asked

    kernel = fused_params(optim, "fp32", "cpu")["optimizer"].value
    try:
        per_row, per_element = _STATE_OF_KERNEL[kernel]
    except KeyError:
        raise ValueError(f"optim.name {optim.name!r}: the memory check does not know the state "
                         f"of fbgemm's {kernel} kernel") from None
    return TableOptimizerState(optim.name, kernel, per_row, per_element)


@dataclass(frozen=True)
class DenseOptimizerState:
    """fp32 values the dense optimizer keeps per parameter value."""

    optim_name: str
    per_parameter: int

    def describe(self) -> str:
        return f"optim.name {self.optim_name}: {self.per_parameter} fp32 per parameter"


def dense_optimizer_state(optim: OptimConfig) -> DenseOptimizerState:
    from dlrmtrain.optim.optimizers import dense_state_per_parameter

    return DenseOptimizerState(optim.name, dense_state_per_parameter(optim))
