"""The jagged code paths against padded / one-sample-at-a-time computations."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from dlrmtrain.models.hstu import jagged
from dlrmtrain.models.hstu.positional import PositionalEncoder
from dlrmtrain.models.hstu.stu import STULayer, STUStack


def _split_rows(values: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    return list(torch.split(values, lengths))


def test_offsets_of_gives_fbgemms_integers_in_the_lengths_dtype():
    """Pure torch now (the attention kernels import without fbgemm); the integers and dtype
    of the fbgemm op it replaced, empty batches and zero lengths included."""
    import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)

    for lengths in ([3, 0, 5, 1], [0], [], [4096] * 3):
        for dtype in (torch.int32, torch.int64):
            t = torch.tensor(lengths, dtype=dtype)
            got, want = jagged.offsets_of(t), torch.ops.fbgemm.asynchronous_complete_cumsum(t)
            assert got.dtype == want.dtype == dtype and torch.equal(got, want), (lengths, dtype, got, want)


def test_jagged_and_the_attention_import_with_torch_alone():
    """A lent GPU machine has torch and triton, no torchrec or fbgemm: the attention package and
    what it imports load there (torchrec and fbgemm made unimportable, as test_gpu_check does);
    the model's names still load lazily where TorchRec is."""
    code = ("import sys\n"
            "for name in ('torchrec', 'fbgemm_gpu'):\n"
            "    sys.modules[name] = None\n"
            "from dlrmtrain.models.hstu import jagged\n"
            "from dlrmtrain.models.hstu.attention import attention_mask, padded_silu_attention\n"
            "print(jagged.offsets_of(jagged.torch.tensor([2, 0, 3])).tolist())\n")
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["[0,", "2,", "2,", "5]"]
    from dlrmtrain.models.hstu import DlrmHSTU, build_hstu_model
    from dlrmtrain.models import build_dlrm_model
    assert callable(build_hstu_model) and callable(build_dlrm_model) and DlrmHSTU.__name__ == "DlrmHSTU"


def test_padded_round_trip_and_padding():
    lengths = [3, 0, 5, 1]
    offsets = jagged.offsets_of(torch.tensor(lengths))
    values = torch.randn(sum(lengths), 2, dtype=torch.float64)
    padded = jagged.to_padded(values, offsets, 6, padding_value=-1.0)
    for b, rows in enumerate(_split_rows(values, lengths)):
        assert torch.equal(padded[b, :lengths[b]], rows)
        assert (padded[b, lengths[b]:] == -1.0).all()
    assert torch.equal(jagged.to_jagged(padded, offsets, sum(lengths)), values)


def test_concat_and_split_match_the_padded_construction():
    """Per sample, left rows then right rows; split gives both back (also 1-D values)."""
    gen = torch.Generator().manual_seed(1)
    left_lengths, right_lengths = [2, 0, 4, 1], [1, 3, 0, 2]
    for trailing in [(3,), ()]:
        left = torch.randn(sum(left_lengths), *trailing, generator=gen, dtype=torch.float64)
        right = torch.randn(sum(right_lengths), *trailing, generator=gen, dtype=torch.float64)
        ll, rl = torch.tensor(left_lengths), torch.tensor(right_lengths)
        got = jagged.concat(left, ll, right, rl)
        want = torch.cat([torch.cat([a, b]) for a, b in zip(_split_rows(left, left_lengths),
                                                            _split_rows(right, right_lengths))])
        assert torch.equal(got, want)
        back_left, back_right = jagged.split(got, ll, rl, sum(right_lengths))
        assert torch.equal(back_left, left) and torch.equal(back_right, right)


def test_concat_gradients_flow_to_both_sides():
    left = torch.randn(3, 2, requires_grad=True)
    right = torch.randn(2, 2, requires_grad=True)
    out = jagged.concat(left, torch.tensor([1, 2]), right, torch.tensor([1, 1]))
    (out * torch.arange(5.0).unsqueeze(1)).sum().backward()
    # output order: L0, R0, L1, L2, R1 -> weights 0, 1, 2, 3, 4
    assert torch.equal(left.grad[:, 0], torch.tensor([0.0, 2.0, 3.0]))
    assert torch.equal(right.grad[:, 0], torch.tensor([1.0, 4.0]))


def test_stu_stack_on_a_jagged_batch_equals_each_sample_alone():
    """The padded batch holds samples of different lengths; run alone (same N, the
    1/N scale), every sample's rows come out the same: nothing leaks across samples
    or from the padding."""
    torch.manual_seed(0)
    stack = STUStack([STULayer(8, 2, 3, 4, dropout=0.0) for _ in range(2)]).double()
    lengths, num_targets = torch.tensor([5, 2, 7]), torch.tensor([1, 1, 2])
    x = torch.randn(int(lengths.sum()), 8, dtype=torch.float64)
    batch_out = stack(x, jagged.offsets_of(lengths), lengths, num_targets, 7)
    for b, rows in enumerate(_split_rows(x, lengths.tolist())):
        one = torch.tensor([int(lengths[b])])
        alone = stack(rows, jagged.offsets_of(one), one, num_targets[b:b + 1], 7)
        start = int(lengths[:b].sum())
        torch.testing.assert_close(batch_out[start:start + len(rows)], alone, rtol=1e-12, atol=1e-12)


def test_positional_encoder_on_a_jagged_batch_equals_each_sample_alone():
    torch.manual_seed(0)
    enc = PositionalEncoder(num_positions=9, num_time_buckets=6, dim=4, num_contextual=2).double()
    lengths, num_targets = torch.tensor([6, 3, 12]), torch.tensor([1, 1, 1])
    x = torch.randn(int(lengths.sum()), 4, dtype=torch.float64)
    ts = torch.cat([torch.cat([torch.zeros(2, dtype=torch.int64),
                               torch.arange(0, 70 * (n - 2), 70)]) for n in lengths.tolist()])
    out = enc(x, jagged.offsets_of(lengths), lengths, num_targets, ts, 12)
    for b in range(3):
        one, start = lengths[b:b + 1], int(lengths[:b].sum())
        rows = slice(start, start + int(lengths[b]))
        alone = enc(x[rows], jagged.offsets_of(one), one, num_targets[b:b + 1], ts[rows], 12)
        torch.testing.assert_close(out[rows], alone, rtol=0, atol=0)
    # and the first sample by hand: contextual rows 0, 1; then positions count down to
    # the candidate's, 2 (= the number of contextual rows); time buckets
    # floor(sqrt(dt / 60 s)) capped at 6 (the contextual rows have t = 0)
    pos = [0, 1, 5, 4, 3, 2]
    query = int(ts[5])
    buckets = [min(int(((query - int(t)) / 60.0) ** 0.5), 6) for t in ts[:6]]
    want = x[:6] * 2.0 + enc.position_table[pos] + enc.time_table[buckets]
    torch.testing.assert_close(out[:6], want, rtol=1e-12, atol=1e-12)
