"""Distinct ids without a full sort (comm/dedup/unique.py) give exactly what torch.unique gives:
the same values in the same order, the same dtypes and the same inverse, on the counting path
(many ids over few rows) and the sort path (few ids, or sparse ones), and the edge inputs."""

from __future__ import annotations

import pytest
import torch

from dlrmtrain.comm.dedup.unique import DistinctIds, unique_keys, unique_rows


def _expected(parts, dtype):
    ids = torch.cat(parts) if parts else torch.zeros(0, dtype=dtype)
    values, inverse = torch.unique(ids, sorted=True, return_inverse=True)
    return values, list(torch.split(inverse, [p.numel() for p in parts]))


def _random_parts(n, rows, dtype, seed, pieces=3):
    g = torch.Generator().manual_seed(seed)
    popular = torch.randint(0, rows, (max(1, n // 20),), generator=g)  # ids repeat, as a table's do
    ids = popular[torch.randint(0, popular.numel(), (n,), generator=g)].to(dtype)
    cuts = sorted(torch.randint(0, n + 1, (pieces - 1,), generator=g).tolist())
    return list(torch.tensor_split(ids, cuts))  # uneven parts, some possibly empty


CASES = {  # name → (parts, bound)
    "counting": (_random_parts(20_000, 50_000, torch.int64, 0), 50_000),
    "counting_int32": (_random_parts(20_000, 50_000, torch.int32, 1), 50_000),
    "sparse_rows": (_random_parts(20_000, 10 ** 9, torch.int64, 2), 10 ** 9),
    "few_ids": (_random_parts(100, 1000, torch.int64, 3), 1000),
    "empty": ([torch.zeros(0, dtype=torch.int64)], 10),
    "no_parts": ([], 10),
    "one_id": ([torch.tensor([7])], 10),
    "all_same": ([torch.full((10_000,), 5, dtype=torch.int32), torch.full((3,), 5, dtype=torch.int32)], 6),
    "max_and_zero": ([torch.tensor([9, 0] * 5_000), torch.tensor([9])], 10),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_unique_keys_is_torch_unique_bitwise(name):
    parts, bound = CASES[name]
    dtype = parts[0].dtype if parts else torch.int64
    values, inverse = unique_keys(parts, bound)
    want_values, want_inverse = _expected(parts, dtype)
    assert values.dtype == want_values.dtype and torch.equal(values, want_values)
    assert len(inverse) == len(parts)
    for got, want in zip(inverse, want_inverse):
        assert got.dtype == torch.int64 and torch.equal(got, want)


def test_both_paths_are_taken():
    # the cases above would pass with the sort alone: make sure the counting pass ran where it should
    assert DistinctIds(*CASES["counting"])._rows is not None
    assert DistinctIds(*CASES["counting_int32"])._rows is not None
    assert DistinctIds(*CASES["sparse_rows"])._rows is None and DistinctIds(*CASES["few_ids"])._rows is None


@pytest.mark.parametrize("name", ["counting", "few_ids"])
def test_labels_are_read_for_each_position_into_the_given_tensors(name):
    parts, bound = CASES[name]
    found = DistinctIds(parts, bound)
    labels = torch.randperm(found.values.numel(), generator=torch.Generator().manual_seed(0)) * 3
    out = [torch.full((p.numel(),), -1, dtype=torch.int64) for p in parts]
    got = found.inverse(labels, out=out)
    for g, o, i in zip(got, out, _expected(parts, parts[0].dtype)[1]):
        assert g is o and torch.equal(o, labels[i])


@pytest.mark.parametrize("bad", [-1, 10])
def test_an_id_outside_the_rows_is_refused(bad):
    with pytest.raises(ValueError, match=r"outside \[0, 10\)"):
        unique_keys([torch.arange(10).repeat(500), torch.tensor([bad])], 10)


ROWS = {
    "bags": torch.randint(0, 4, (3000, 5), generator=torch.Generator().manual_seed(0)),
    "negative": torch.tensor([[2, -1], [-5, 3], [2, -1], [0, 0], [-5, 2]]),
    "int32": torch.randint(-3, 3, (500, 3), generator=torch.Generator().manual_seed(1)).to(torch.int32),
    "all_same": torch.ones(50, 4, dtype=torch.int64),
    "one_row": torch.tensor([[3, 1, 2]]),
    "no_rows": torch.zeros(0, 3, dtype=torch.int64),
    "one_column": torch.tensor([[4], [1], [4], [2]]),
}


@pytest.mark.parametrize("name", sorted(ROWS))
def test_unique_rows_is_torch_unique_over_rows_bitwise(name):
    rows = ROWS[name]
    values, inverse = unique_rows(rows)
    want_values, want_inverse = torch.unique(rows, dim=0, sorted=True, return_inverse=True)
    assert values.dtype == want_values.dtype and values.shape == want_values.shape
    assert torch.equal(values, want_values)
    assert inverse.dtype == want_inverse.dtype and torch.equal(inverse, want_inverse)

