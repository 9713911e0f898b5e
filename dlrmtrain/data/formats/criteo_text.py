"""Vectorised parser for raw Criteo day files (label, I1-I13, C1-C26; tab-separated).

Whole chunks of text are parsed with numpy: separators are located once, every
field becomes a (start, end) byte range, and integers / hex values are decoded
by gathering a fixed-width window of bytes per field. Pure-Python per-field
parsing reaches ~13 MB/s on this machine; this path is several times faster.

Bad lines (wrong field count, non-hex categorical, non-integer dense value, bad
label) either stop the run with file, line and field (policy ``error``, the
default) or are skipped and counted (policy ``skip``); never dropped silently.
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

import numpy as np

from dlrmtrain.data.formats.ascii_fields import (
    DEC_LUT, HEX_LUT, MAX_HEX_DIGITS, decode_decimal8, decode_fixed_width, decode_hex8,
)
from dlrmtrain.features import NUM_DENSE, NUM_TEXT_FIELDS, TEXT_FIELD_NAMES

BAD_LINE_POLICIES = ("error", "skip")
MAX_DENSE_CHARS = 18  # sign + 17 digits still fits int64
_TAB, _NEWLINE, _MINUS = 9, 10, 45
_PAD = b"\0" * 8


class BadLineError(ValueError):
    """A malformed input line under policy ``error``: names file, line and field."""


@dataclass
class BadLine:
    """One rejected line: where it is, which field, why, and the start of its text."""

    path: str
    line_no: int
    field: str
    reason: str
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line_no}: field {self.field}: {self.reason} (line starts {self.text!r})"


@dataclass
class BadLineStats:
    """Skipped-line count plus the first few examples, for the closing summary."""

    count: int = 0
    examples: list[BadLine] = field(default_factory=list)
    max_examples: int = 5
    crlf_lines: int = 0  # lines that ended in CR LF (accepted: the CR is stripped)

    def add(self, bad: BadLine) -> None:
        self.count += 1
        if len(self.examples) < self.max_examples:
            self.examples.append(bad)

    def merge(self, other: "BadLineStats") -> None:
        self.count += other.count
        self.crlf_lines += other.crlf_lines
        for bad in other.examples:
            if len(self.examples) < self.max_examples:
                self.examples.append(bad)


@dataclass
class ParsedRows:
    """Decoded rows of one chunk: raw (untransformed) values, missing fields as 0."""

    labels: np.ndarray  # uint8 [N]
    dense: np.ndarray  # int64 [N, 13]
    cats: np.ndarray  # uint32 [N, 26], the 32-bit hex value
    line_numbers: np.ndarray  # int64 [N], 1-based line number in the source file

    def __len__(self) -> int:
        return len(self.labels)


def iter_line_chunks(stream: BinaryIO, chunk_bytes: int = 4 << 20) -> Iterator[bytes]:
    """Yield chunks of whole lines, each ending in a newline (one is added at EOF if missing)."""
    carry = b""
    while True:
        block = stream.read(chunk_bytes)
        if not block:
            break
        block = carry + block
        cut = block.rfind(b"\n") + 1
        if cut == 0:  # a single line longer than the chunk: keep reading
            carry = block
            continue
        carry = block[cut:]
        yield block[:cut]
    if carry:
        yield carry + b"\n"


class ChunkParser:
    """Parses chunks of one file, tracking line numbers and applying the bad-line policy."""

    def __init__(self, path: str | Path, bad_lines: str = "error", stats: BadLineStats | None = None) -> None:
        if bad_lines not in BAD_LINE_POLICIES:
            raise ValueError(f"bad_lines must be one of {BAD_LINE_POLICIES}, got {bad_lines!r}")
        self.path = str(path)
        self.policy = bad_lines
        self.stats = stats if stats is not None else BadLineStats()
        self.next_line_no = 1

    def parse(self, chunk: bytes) -> ParsedRows:
        """Parse a chunk of whole lines (ending in '\\n') into decoded rows."""
        # 8 zero bytes of padding on each side let 8-byte word gathers run past either end.
        buf = np.frombuffer(_PAD + chunk + _PAD, dtype=np.uint8)
        first_line_no = self.next_line_no
        separators = np.flatnonzero((buf == _TAB) | (buf == _NEWLINE))
        is_newline = buf[separators] == _NEWLINE
        newline_sep_idx = np.flatnonzero(is_newline)
        n_lines = len(newline_sep_idx)
        self.next_line_no += n_lines
        fields_per_line = np.diff(newline_sep_idx, prepend=-1)
        bad_mask = fields_per_line != NUM_TEXT_FIELDS
        line_starts = np.concatenate(([len(_PAD)], separators[newline_sep_idx[:-1]] + 1))

        bad_reasons: dict[int, tuple[str, str]] = {}
        for line in np.flatnonzero(bad_mask)[: self._max_reports()]:
            bad_reasons[int(line)] = ("*", f"expected {NUM_TEXT_FIELDS} fields, got {fields_per_line[line]}")
        if bad_mask.any():
            # Drop separators of lines with the wrong field count so the rest reshape cleanly.
            line_of_sep = np.repeat(np.arange(n_lines), fields_per_line)
            separators = separators[~bad_mask[line_of_sep]]
        good_lines = np.flatnonzero(~bad_mask)
        ends = separators.reshape(len(good_lines), NUM_TEXT_FIELDS)
        starts = np.empty_like(ends)
        starts[:, 0] = line_starts[good_lines]
        starts[:, 1:] = ends[:, :-1] + 1

        labels, label_bad = self._decode_labels(buf, starts[:, 0], ends[:, 0])
        dense, dense_bad = self._decode_dense(buf, starts[:, 1 : 1 + NUM_DENSE], ends[:, 1 : 1 + NUM_DENSE])
        cats, cat_bad = self._decode_cats(buf, starts[:, 1 + NUM_DENSE :], ends[:, 1 + NUM_DENSE :])

        field_bad = np.concatenate([label_bad[:, None], dense_bad, cat_bad], axis=1)
        rows_bad = field_bad.any(axis=1)
        for row in np.flatnonzero(rows_bad)[: self._max_reports()]:
            col = int(np.argmax(field_bad[row]))
            text = bytes(buf[starts[row, col] : ends[row, col]]).decode("latin-1")
            bad_reasons[int(good_lines[row])] = (TEXT_FIELD_NAMES[col], self._field_reason(col, text))
        n_bad = int(bad_mask.sum() + rows_bad.sum())
        if n_bad:
            self._report(buf, line_starts, first_line_no, bad_reasons, n_bad)
        keep = ~rows_bad
        return ParsedRows(
            labels=labels[keep],
            dense=dense[keep],
            cats=cats[keep],
            line_numbers=first_line_no + good_lines[keep],
        )

    def _max_reports(self) -> int:
        # Under "error" only the first bad line matters; under "skip" only the examples kept.
        return 1 if self.policy == "error" else self.stats.max_examples

    @staticmethod
    def _field_reason(col: int, text: str) -> str:
        if col == 0:
            return f"label must be 0 or 1, got {text!r}"
        if col <= NUM_DENSE:
            return f"dense value is not an integer: {text!r}"
        return f"categorical is not 1-{MAX_HEX_DIGITS} hex digits: {text!r}"

    def _report(
        self, buf: np.ndarray, line_starts: np.ndarray, first_line_no: int,
        reasons: dict[int, tuple[str, str]], n_bad: int,
    ) -> None:
        bad_list = []
        for line in sorted(reasons):
            field_name, reason = reasons[line]
            start = int(line_starts[line])
            text = bytes(buf[start : start + 60]).split(b"\n")[0].decode("latin-1")
            bad_list.append(BadLine(self.path, first_line_no + line, field_name, reason, text))
        if self.policy == "error":
            raise BadLineError(
                f"{bad_list[0]}. Pass bad_lines='skip' (--bad-lines skip) to skip and count such lines."
            )
        # Examples are recorded for the first few; the count covers every skipped line.
        for bad in bad_list:
            self.stats.add(bad)
        self.stats.count += n_bad - len(bad_list)

    @staticmethod
    def _decode_labels(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        first = buf[np.minimum(starts, len(buf) - 1)]
        bad = ((ends - starts) != 1) | ((first != 48) & (first != 49))
        return (first - 48).astype(np.uint8), bad

    @staticmethod
    def _decode_dense(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        negative = buf[starts] == _MINUS  # a minus is only valid as the first character
        digit_starts = starts + negative
        lengths = ends - digit_starts
        value, bad = decode_decimal8(buf, digit_starts, ends)
        # Rare fields of 9+ digits take the slower general path.
        long = lengths > 8
        if long.any():
            width = int(min(lengths[long].max(), MAX_DENSE_CHARS))
            long_value, digits, in_field = decode_fixed_width(
                buf, digit_starts[long], ends[long], width, DEC_LUT, 10
            )
            value[long] = long_value
            bad[long] = (lengths[long] > MAX_DENSE_CHARS) | (in_field & (digits < 0)).any(axis=-1)
        bad |= negative & (lengths == 0)
        return np.where(negative, -value, value), bad

    @staticmethod
    def _decode_cats(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lengths = ends - starts
        value, bad = decode_hex8(buf, starts)
        # Criteo writes 8 digits or nothing; other lengths take the general path.
        odd = lengths != MAX_HEX_DIGITS
        if odd.any():
            width = int(min(max(lengths[odd].max(), 1), MAX_HEX_DIGITS))
            odd_value, digits, in_field = decode_fixed_width(buf, starts[odd], ends[odd], width, HEX_LUT, 16)
            value[odd] = odd_value
            bad[odd] = (lengths[odd] > MAX_HEX_DIGITS) | (in_field & (digits < 0)).any(axis=-1)
        return value.astype(np.uint32), bad


def iter_parsed(
    path: str | Path, bad_lines: str = "error", stats: BadLineStats | None = None,
    chunk_bytes: int = 4 << 20, on_bytes: Callable[[int], None] | None = None,
) -> Iterator[ParsedRows]:
    """Stream a (plain or .gz) day file as parsed chunks; `on_bytes(n)` reports input progress.

    CR LF line endings are accepted (the CR is stripped) and counted in the stats; an
    empty file, or a truncated or corrupt .gz, is an error naming the file."""
    parser = ChunkParser(path, bad_lines, stats)
    with open(path, "rb") as raw:
        stream = gzip.GzipFile(fileobj=raw) if raw.read(2) == b"\x1f\x8b" else raw
        raw.seek(0)
        position = 0
        chunks = iter_line_chunks(stream, chunk_bytes)
        while True:
            try:
                chunk = next(chunks, None)
            except (EOFError, gzip.BadGzipFile, zlib.error) as e:
                raise ValueError(f"{path}: truncated or corrupt gzip data after line "
                                 f"{parser.next_line_no - 1} ({e})") from None
            if chunk is None:
                break
            if b"\r" in chunk:
                parser.stats.crlf_lines += chunk.count(b"\r\n")
                chunk = chunk.replace(b"\r\n", b"\n")
            rows = parser.parse(chunk)
            if on_bytes is not None:
                now = raw.tell()
                on_bytes(now - position)
                position = now
            yield rows
    if parser.next_line_no == 1:
        raise ValueError(f"{path}: empty input (no lines)")
