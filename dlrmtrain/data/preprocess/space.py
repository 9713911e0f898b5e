"""The disk space a preprocess needs, estimated before anything is written.

Rows are estimated per input from its first MB (lines per text byte, and for .gz the
compression ratio of that MB), so the estimate costs a read of 1 MB per file. What a
run writes, at its peak:

- every part: 157 bytes per row (dense 52, sparse 104, label 1);
- mode mlperf_vocab, also: the vocabulary (one bit per hashed value per column: 130 MB
  at the 40M range, whatever the input's size), each file's pass-1 distinct values (at
  most 4 bytes per row and column), and while pass 2 runs, the new sparse files of the
  parts in flight next to their staged copies (dense and labels are hard-linked over).

Work already done (finished parts, staged parts, a saved vocabulary) needs nothing.
Rows are an estimate and the distinct values a bound: the figure is "about".
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path

from dlrmtrain.data.formats import binary as bf
from dlrmtrain.data.formats.writes import check_free_space
from dlrmtrain.run.console import human_bytes
from dlrmtrain.data.preprocess.vocab import distinct_bytes, vocabulary_bytes

SAMPLE_BYTES = 1 << 20
MARGIN_BYTES = 1 << 20  # manifest, part.json files, the lock, directory entries


def estimate_rows(path: str | Path) -> int:
    """About how many lines `path` (plain or gzip) holds, from its first SAMPLE_BYTES."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(SAMPLE_BYTES)
    if head[:2] == b"\x1f\x8b":
        inflate = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)
        try:
            text = inflate.decompress(head)
        except zlib.error:  # not really gzip: the parse reports it, by name
            return 0
        used = len(head) - len(inflate.unused_data)
        if len(head) == size and inflate.eof and not inflate.unused_data:
            return text.count(b"\n") + (not text.endswith(b"\n") and bool(text))
        text_bytes = size * len(text) / max(used, 1)
    else:
        text, text_bytes = head, size
        if len(head) == size:
            return text.count(b"\n") + (not text.endswith(b"\n") and bool(text))
    lines = text.count(b"\n")
    return int(text_bytes / (len(text) / lines)) + 1 if lines else 1


KINDS = ("parts", "staging", "vocabulary", "pass-1 distinct values")
"""What a preprocess writes, in the order the refusal names them."""


@dataclass
class SpaceEstimate:
    """Bytes a preprocess will write, by kind (`KINDS`), and each remaining input's expected rows."""

    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    rows: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.bytes.values()) + MARGIN_BYTES

    def render(self) -> str:
        return ", ".join(f"{k} {human_bytes(v)}" for k, v in self.bytes.items() if v)


def estimate_space(parts: dict[str, str], out: Path, mode: str, hash_range: int, workers: int,
                   staging: Path, pass1: Path, vocabulary: Path) -> SpaceEstimate:
    """What writing the inputs `parts` (input path -> part name) into `out` still needs;
    `staging`, `pass1` and `vocabulary` are where mode mlperf_vocab keeps its own files."""
    est = SpaceEstimate()
    in_flight: list[int] = []  # pass 2's new sparse bytes per part, for the peak
    for path, name in parts.items():
        if bf.finished_part_meta(out, name) is not None:
            continue
        staged = bf.finished_part_meta(staging, name) if mode == "mlperf_vocab" else None
        rows = staged["rows"] if staged is not None else estimate_rows(path)
        est.rows[path] = rows
        if mode != "mlperf_vocab":
            est.bytes["parts"] += rows * bf.PART_ROW_BYTES
            continue
        if staged is None:
            est.bytes["staging"] += rows * bf.PART_ROW_BYTES
        if not (pass1 / f"{name}.npz").exists():
            est.bytes["pass-1 distinct values"] += distinct_bytes(rows, hash_range)
        in_flight.append(rows * bf.row_bytes("sparse.i32"))
    if mode == "mlperf_vocab" and est.rows:
        est.bytes["parts"] = sum(sorted(in_flight, reverse=True)[:max(workers, 1)])
        if not vocabulary.exists():
            est.bytes["vocabulary"] = vocabulary_bytes(hash_range)
    return est


def refuse_if_short(out: Path, est: SpaceEstimate) -> None:
    """Refuse (NotEnoughSpace), before anything is written, when `out`'s file system
    cannot hold `est`."""
    if est.rows:
        check_free_space(out, est.total, est.render(), "free some space or choose another --out")


