"""Train / eval splits over a dataset's parts.

- `mlperf`: train on days 0-22, evaluate on the first half of day 23 (rows
  [0, ceil(N/2)): 89,137,319 of day 23's 178,274,637). For the facebookresearch
  .bin layout, whose files are already split that way: train = `train`, eval = `test`.
- `names`: any explicit lists of part names (files) for train and eval.
- `fraction`: for small data, the last `eval_fraction` of all rows (in order) is eval.
"""

from __future__ import annotations

from typing import Sequence

from dlrmtrain.config.schema import SplitKind, choices
from dlrmtrain.data.parts import Part, RowRange, total_rows

SPLIT_KINDS = choices(SplitKind)
MLPERF_TRAIN_DAYS = 23  # day_0 ... day_22


def _by_name(parts: Sequence[Part]) -> dict[str, Part]:
    return {p.name: p for p in parts}


def mlperf_split(parts: Sequence[Part]) -> tuple[list[Part], list[Part]]:
    named = _by_name(parts)
    if "train" in named and "test" in named:  # facebookresearch .bin layout
        return [named["train"]], [named["test"]]
    missing = [f"day_{d}" for d in range(MLPERF_TRAIN_DAYS + 1) if f"day_{d}" not in named]
    if missing:
        raise ValueError(f"MLPerf split needs day_0 ... day_23; missing {missing} (have {sorted(named)})")
    day23 = named["day_23"]
    train = [named[f"day_{d}"] for d in range(MLPERF_TRAIN_DAYS)]
    return train, [RowRange(day23, 0, (day23.rows + 1) // 2)]


def names_split(
    parts: Sequence[Part], train_names: Sequence[str], eval_names: Sequence[str]
) -> tuple[list[Part], list[Part]]:
    named = _by_name(parts)
    unknown = [n for n in [*train_names, *eval_names] if n not in named]
    if unknown:
        raise ValueError(f"unknown part names {unknown}; dataset has {sorted(named)}")
    overlap = sorted(set(train_names) & set(eval_names))
    if overlap:
        raise ValueError(f"parts {overlap} are in both train and eval")
    return [named[n] for n in train_names], [named[n] for n in eval_names]


def fraction_split(parts: Sequence[Part], eval_fraction: float) -> tuple[list[Part], list[Part]]:
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    boundary = total_rows(parts) - round(total_rows(parts) * eval_fraction)
    train: list[Part] = []
    evaluation: list[Part] = []
    offset = 0
    for part in parts:
        cut = min(max(boundary - offset, 0), part.rows)
        if cut > 0:
            train.append(part if cut == part.rows else RowRange(part, 0, cut))
        if cut < part.rows:
            evaluation.append(part if cut == 0 else RowRange(part, cut, part.rows))
        offset += part.rows
    return train, evaluation
