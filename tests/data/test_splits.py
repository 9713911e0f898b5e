"""MLPerf, name and fraction splits."""

from __future__ import annotations

import pytest

from dlrmtrain.data.splits import fraction_split, mlperf_split, names_split


class FakePart:  # a Part needs only name/rows/read; splits never read
    def __init__(self, name, rows):
        self.name, self.rows = name, rows

    def read(self, start, stop):
        raise AssertionError("splits must not read rows")


def test_mlperf_split_days_and_half_of_day_23():
    parts = [FakePart(f"day_{d}", 100 + d) for d in range(24)]
    parts[23] = FakePart("day_23", 178_274_637)
    train, evaluation = mlperf_split(parts)
    assert [p.name for p in train] == [f"day_{d}" for d in range(23)]
    assert len(evaluation) == 1 and evaluation[0].rows == 89_137_319  # MLPerf's eval sample count
    assert (evaluation[0].begin, evaluation[0].part.name) == (0, "day_23")


def test_mlperf_split_names_missing_days():
    with pytest.raises(ValueError, match=r"missing \['day_5'"):
        mlperf_split([FakePart(f"day_{d}", 1) for d in range(24) if d != 5])


def test_names_split():
    parts = [FakePart(n, 3) for n in ("a", "b", "c")]
    train, evaluation = names_split(parts, ["c", "a"], ["b"])
    assert [p.name for p in train] == ["c", "a"] and [p.name for p in evaluation] == ["b"]
    with pytest.raises(ValueError, match=r"unknown part names \['z'\]"):
        names_split(parts, ["z"], ["b"])
    with pytest.raises(ValueError, match="in both"):
        names_split(parts, ["a"], ["a"])


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.5, 0.95])
def test_fraction_split_partitions_rows_in_order(fraction):
    parts = [FakePart("x", 7), FakePart("y", 0), FakePart("z", 13)]
    train, evaluation = fraction_split(parts, fraction)
    assert sum(p.rows for p in evaluation) == round(20 * fraction)
    assert sum(p.rows for p in train) + sum(p.rows for p in evaluation) == 20
    if 0 < fraction < 0.5:
        assert evaluation[0].name == "z[" + str(13 - round(20 * fraction)) + ":13]"
