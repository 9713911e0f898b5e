"""The vectorised raw-text parser against an independent pure-Python parse, and bad-line policies."""

from __future__ import annotations

import numpy as np
import pytest

from dlrmtrain.data.formats.criteo_text import BadLineError, BadLineStats, iter_parsed
from tests.data.raw_rows import independent_parse, random_raw_lines, write_lines


def parse_all(path, **kwargs):
    chunks = list(iter_parsed(path, **kwargs))
    return (np.concatenate([c.labels for c in chunks]), np.concatenate([c.dense for c in chunks]),
            np.concatenate([c.cats for c in chunks]), np.concatenate([c.line_numbers for c in chunks]))


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("chunk_bytes", [1 << 20, 997])  # 997: many chunk boundaries mid-line
def test_parse_matches_independent_parse(tmp_path, gz, chunk_bytes):
    lines = random_raw_lines(600, seed=1)
    path = write_lines(tmp_path / ("day_0.gz" if gz else "day_0"), lines, gz=gz)
    labels, dense, cats, line_numbers = parse_all(path, chunk_bytes=chunk_bytes)
    want_labels, want_dense, want_cats = independent_parse(lines)
    np.testing.assert_array_equal(labels, want_labels)
    np.testing.assert_array_equal(dense, want_dense)
    np.testing.assert_array_equal(cats.astype(np.int64), want_cats)
    np.testing.assert_array_equal(line_numbers, np.arange(1, len(lines) + 1))


def test_short_uppercase_hex_and_missing_last_newline(tmp_path):
    line = "\t".join(["1"] + ["7"] * 13 + ["ABCDEF12", "f", "", "00000001"] + ["0a0b0c0d"] * 22)
    path = write_lines(tmp_path / "d", [line, line], trailing_newline=False)
    labels, dense, cats, _ = parse_all(path)
    assert len(labels) == 2
    assert list(cats[0, :4]) == [0xABCDEF12, 0xF, 0, 1]
    assert (dense == 7).all()


BAD_CASES = {
    "field_count": ("\t".join(["0"] + ["1"] * 13 + ["0a0b0c0d"] * 25), "*", "expected 40 fields, got 39"),
    "non_hex": ("\t".join(["0"] + ["1"] * 13 + ["0a0b0c0d"] * 5 + ["0a0b0c0g"] + ["0a0b0c0d"] * 20), "C6",
                "categorical is not"),
    "non_integer_dense": ("\t".join(["0", "1", "2.5"] + ["1"] * 11 + ["0a0b0c0d"] * 26), "I2",
                          "dense value is not an integer"),
    "lone_minus_dense": ("\t".join(["0"] + ["1"] * 12 + ["-"] + ["0a0b0c0d"] * 26), "I13",
                         "dense value is not an integer"),
    "bad_label": ("\t".join(["2"] + ["1"] * 13 + ["0a0b0c0d"] * 26), "label", "label must be 0 or 1"),
    "too_long_hex": ("\t".join(["0"] + ["1"] * 13 + ["0a0b0c0d0"] + ["0a0b0c0d"] * 25), "C1",
                     "categorical is not"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_line_error_policy_names_file_line_field(tmp_path, case):
    bad_line, field, reason = BAD_CASES[case]
    good = random_raw_lines(30, seed=2)
    path = write_lines(tmp_path / "day_5", good[:17] + [bad_line] + good[17:])
    with pytest.raises(BadLineError) as err:
        parse_all(path)
    message = str(err.value)
    assert f"{path}:18:" in message
    assert f"field {field}:" in message
    assert reason in message


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_line_skip_policy_counts_and_reports(tmp_path, case):
    bad_line, field, reason = BAD_CASES[case]
    good = random_raw_lines(30, seed=3)
    lines = good[:5] + [bad_line] + good[5:20] + [bad_line] + good[20:]
    path = write_lines(tmp_path / "day_5", lines)
    stats = BadLineStats()
    labels, dense, cats, line_numbers = parse_all(path, bad_lines="skip", stats=stats)
    assert stats.count == 2
    assert [e.line_no for e in stats.examples] == [6, 22]
    assert all(e.field == field and reason in e.reason for e in stats.examples)
    want_labels, want_dense, want_cats = independent_parse(good)
    np.testing.assert_array_equal(dense, want_dense)
    np.testing.assert_array_equal(cats.astype(np.int64), want_cats)
    assert 6 not in line_numbers and 22 not in line_numbers and len(line_numbers) == 30


def test_unknown_policy_rejected(tmp_path):
    path = write_lines(tmp_path / "d", random_raw_lines(2))
    with pytest.raises(ValueError, match="bad_lines must be one of"):
        parse_all(path, bad_lines="ignore")
