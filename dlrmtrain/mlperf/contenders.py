"""A contender of a series at a precision: `dedup@bf16` is `dedup` under `precision.mode: bf16`.

The MLPerf runner's `--precisions fp32,bf16` runs every `--codecs` entry under each
precision, so the paper's two figures (time to solution none / dedup in FP32 and in mixed
precision) come from one interleaved series. A label without `@` runs at the config's own
precision. Ratios are taken within a precision (each precision's first codec is its
baseline), and across precisions per codec (fp32's score over bf16's: what mixed precision
itself gains). Torch-free, so the report can name runs with it.
"""

from __future__ import annotations

from typing import Optional

from dlrmtrain.config.schema import PrecisionMode, choices

PRECISIONS: tuple[str, ...] = choices(PrecisionMode)


def with_precision(label: str, precision: Optional[str]) -> str:
    """`dedup`, `fp32` → `dedup@fp32`; no precision: the label as it is."""
    return f"{label}@{precision}" if precision else label


def split_precision(label: str) -> tuple[str, Optional[str]]:
    """(`--codecs` entry, precision or None) of `with_precision`'s output; a clear error
    for a precision that `precision.mode` does not take."""
    codec, at, precision = label.partition("@")
    if at and precision not in PRECISIONS:
        raise ValueError(f"{label!r}: {precision!r} after '@' is not a precision "
                         f"({', '.join(PRECISIONS)})")
    return codec, precision if at else None


def expand(codecs: list[str], precisions: Optional[list[str]]) -> tuple[str, ...]:
    """Every codec under every precision, precision by precision (`none,dedup` × `fp32,bf16`
    → none@fp32, dedup@fp32, none@bf16, dedup@bf16); no precisions: the codecs as given."""
    if not precisions:
        return tuple(codecs)
    at = [c for c in codecs if "@" in c]
    if at:
        raise ValueError(f"--codecs {','.join(at)}: give a precision with '@' or with "
                         f"--precisions, not both")
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown or len(set(precisions)) != len(precisions):
        raise ValueError(f"--precisions {','.join(precisions)}: each of {', '.join(PRECISIONS)} "
                         f"at most once")
    return tuple(with_precision(c, p) for p in precisions for c in codecs)


def precision_overrides(label: str) -> list[str]:
    """The config setting a label's precision asks for (none without `@`)."""
    precision = split_precision(label)[1]
    return [f"precision.mode={precision}"] if precision else []


def ratios_by_precision(scores: dict[str, Optional[float]]) -> dict[Optional[str], dict[str, float]]:
    """precision → {codec: score of that precision's first codec over the codec's}, from the
    scores (minutes, None: not scored) of every contender in `--codecs` order; a precision
    whose baseline has no score has no ratios."""
    groups: dict[Optional[str], list[tuple[str, Optional[float]]]] = {}
    for label, minutes in scores.items():
        codec, precision = split_precision(label)
        groups.setdefault(precision, []).append((codec, minutes))
    ratios: dict[Optional[str], dict[str, float]] = {}
    for precision, entries in groups.items():
        base = entries[0][1]
        ratios[precision] = {} if base is None else {
            codec: base / minutes for codec, minutes in entries[1:] if minutes is not None}
    return ratios


def mixed_precision_speedups(scores: dict[str, Optional[float]]) -> dict[str, float]:
    """codec → its fp32 score over its bf16 score (>1: bf16 reaches the target sooner), for
    each codec scored under both."""
    by = {split_precision(label): minutes for label, minutes in scores.items()}
    return {codec: by[(codec, "fp32")] / minutes for (codec, precision), minutes in by.items()
            if precision == "bf16" and minutes and by.get((codec, "fp32"))}
