"""Vectorised decoding of ASCII integer fields inside a byte buffer.

A field is a byte range [start, end) of `buf`. The fast paths gather the 8 bytes of
each field as one little-endian uint64 and decode all fields with a handful of
whole-array integer operations (SWAR, "SIMD within a register"); a general path
decodes any width digit by digit for the rare fields the fast paths do not cover.
`buf` must carry 8 bytes of padding on each side so word gathers stay inside it.
"""

from __future__ import annotations

import numpy as np

MAX_HEX_DIGITS = 8  # Criteo categoricals are 32-bit hashes

# Byte -> hex digit value, -1 for anything that is not a hex digit.
HEX_LUT = np.full(256, -1, dtype=np.int8)
for _i, _c in enumerate(b"0123456789abcdef"):
    HEX_LUT[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    HEX_LUT[_c] = 10 + _i

DEC_LUT = np.full(256, -1, dtype=np.int8)
DEC_LUT[48:58] = np.arange(10)


def decode_fixed_width(
    buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, width: int, digit_lut: np.ndarray, base: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode right-aligned digit windows of `width` bytes ending at each field end.

    Returns (value int64, per-position digit values, in-field mask) so callers can
    validate characters (e.g. allow a leading minus sign).
    """
    positions = ends[..., None] - width + np.arange(width)
    in_field = positions >= starts[..., None]
    raw = buf[np.maximum(positions, 0)]
    digits = digit_lut[raw].astype(np.int64)
    weights = base ** np.arange(width - 1, -1, -1, dtype=np.int64)
    value = (np.where(in_field & (digits >= 0), digits, 0) * weights).sum(axis=-1)
    return value, digits, in_field


# SWAR ("SIMD within a register") decoding: 8 ASCII characters are gathered as one
# little-endian uint64 and combined with a handful of whole-array integer ops.
_ONES = np.uint64(0x0101010101010101)
_LOW_NIBBLES = np.uint64(0x0F0F0F0F0F0F0F0F)
_ASCII_ZEROS = np.uint64(0x3030303030303030)


def _words_at(buf: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """uint64 little-endian words starting at each byte offset (buf is padded by 8 zero bytes)."""
    view = np.ndarray(shape=(len(buf) - 7,), dtype="<u8", buffer=buf, strides=(1,))
    return view[offsets]


_HIGH_BITS = np.uint64(0x8080808080808080)


def _bytes_at_least(words: np.ndarray, n: int) -> np.ndarray:
    """Per byte: high bit set where byte >= n (valid for bytes < 0x80; borrow-free)."""
    return ((words | _HIGH_BITS) - _ONES * np.uint64(n)) & _HIGH_BITS


def _non_digit_bytes(words: np.ndarray) -> np.ndarray:
    """Whether any of the 8 bytes is not '0'-'9'."""
    ok = _bytes_at_least(words, 0x30) & ~_bytes_at_least(words, 0x3A) & ~words
    return ok != _HIGH_BITS


def _non_hex_bytes(words: np.ndarray) -> np.ndarray:
    """Whether any of the 8 bytes is not 0-9, a-f or A-F."""
    lower = words | (_ONES * np.uint64(0x20))  # 'A'-'F' -> 'a'-'f'; digits keep their value
    digit = _bytes_at_least(words, 0x30) & ~_bytes_at_least(words, 0x3A)
    letter = _bytes_at_least(lower, 0x61) & ~_bytes_at_least(lower, 0x67)
    return ((digit | letter) & ~words) != _HIGH_BITS  # `& ~words` rejects bytes >= 0x80


def decode_hex8(buf: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Value of the 8 hex digits at each start, and whether any of them is not a hex digit."""
    words = _words_at(buf, starts)
    bad = _non_hex_bytes(words)
    is_letter = (words >> np.uint64(6)) & _ONES  # bit 6 is set for a-f / A-F only
    nibbles = (words & _LOW_NIBBLES) + is_letter * np.uint64(9)
    # The first character is the most significant digit and sits in the lowest byte.
    pairs = ((nibbles & np.uint64(0x000F000F000F000F)) << np.uint64(4)) | (
        (nibbles >> np.uint64(8)) & np.uint64(0x000F000F000F000F)
    )
    quads = ((pairs & np.uint64(0x000000FF000000FF)) << np.uint64(8)) | (
        (pairs >> np.uint64(16)) & np.uint64(0x000000FF000000FF)
    )
    value = ((quads & np.uint64(0xFFFF)) << np.uint64(16)) | ((quads >> np.uint64(32)) & np.uint64(0xFFFF))
    return value.astype(np.int64), bad


def decode_decimal8(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Value of up to 8 decimal digits in [start, end) (empty = 0) and whether any is not a digit."""
    lengths = np.clip(ends - starts, 0, 8).astype(np.uint64)
    words = _words_at(buf, ends - 8)  # right-aligned: the last digit lands in the top byte
    keep = np.where(lengths == 0, np.uint64(0), ~np.uint64(0) << ((np.uint64(8) - lengths) * np.uint64(8)))
    words = (words & keep) | (_ASCII_ZEROS & ~keep)  # left-pad with '0'
    bad = _non_digit_bytes(words)
    digits = words - _ASCII_ZEROS
    pairs = (digits & np.uint64(0x00FF00FF00FF00FF)) * np.uint64(10) + (
        (digits >> np.uint64(8)) & np.uint64(0x00FF00FF00FF00FF)
    )
    quads = (pairs & np.uint64(0x0000FFFF0000FFFF)) * np.uint64(100) + (
        (pairs >> np.uint64(16)) & np.uint64(0x0000FFFF0000FFFF)
    )
    value = (quads & np.uint64(0xFFFFFFFF)) * np.uint64(10000) + (quads >> np.uint64(32))
    return value.astype(np.int64), bad
