"""bf16 on the wire on CPU (precision.py): under `precision.mode: bf16` the lookup's fp32 sums are
rounded once to bf16 before the embedding all-to-all, as fbgemm's GPU lookup emits them.

On real Gloo ranks, one spawned group trains `none` and `dedup` under fp32 and under bf16, pooled
(table-, column- and row-wise; one- and multi-hot) and sequence (table-, column- and row-wise):
the rows cross in bf16 (the model receives bf16), their bytes are half fp32's for both codecs
(the counters of comm_stats), `dedup`'s first forward is bitwise `none`'s, and the bf16 rows are
fp32's rounded once (to within a bf16 half-ulp of the fp32 value).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tests.comm.ranks import Scenario, Table, run_codec, to_numpy
from tests.comm.sequence_ranks import SeqScenario, features, train
from tests.multiproc import run_ranks

WORLD = 2
POOLED = Scenario(tables=(
    Table("one", 12, 8, ("tw", 0)),
    Table("multi", 30, 8, ("tw", 1), bag=3),
    Table("cols", 10, 16, ("cw", (0, 1)), bag=2),
    Table("rows", 11, 8, ("rw",)),
), batch=16, steps=3, optimizer="sgd", lr=0.5, id_range=10)
SEQUENCE = SeqScenario(default_type="table_wise", sharding_tables={"item_id": "row_wise", "album_id": "column_wise"})
PRECISIONS = ("fp32", "bf16")
CODECS = ("none", "dedup")


def _all_runs(rank: int, world_size: int) -> dict:
    out = {}
    for precision in PRECISIONS:
        for codec in CODECS:
            out[("pooled", precision, codec)] = to_numpy(run_codec(
                dataclasses.replace(POOLED, precision=precision), codec, rank, world_size, count_stock=True))
            out[("sequence", precision, codec)] = train(
                dataclasses.replace(SEQUENCE, precision=precision), codec, rank, world_size)
    return out


@pytest.fixture(scope="module")
def runs():
    return run_ranks(_all_runs, WORLD, timeout=400)


def _payload(stats: dict) -> dict[str, tuple[int, int]]:
    """Per table: (forward bytes received, backward bytes sent) over the run."""
    return {t: (s["payload_fwd_recv_bytes"], s["payload_bwd_sent_bytes"]) for t, s in stats["tables"].items()}


@pytest.mark.parametrize("kind", ["pooled", "sequence"])
@pytest.mark.parametrize("codec", CODECS)
def test_bf16_rows_cross_in_half_the_bytes(runs, kind, codec):
    for rank in range(WORLD):
        fp32 = _payload(runs[rank][(kind, "fp32", codec)]["stats"])
        bf16 = _payload(runs[rank][(kind, "bf16", codec)]["stats"])
        assert fp32.keys() == bf16.keys() and fp32, (rank, fp32)
        for table, (fwd, bwd) in fp32.items():
            assert bf16[table] == (fwd / 2, bwd / 2), (rank, table, fp32[table], bf16[table])
        total = sum(sum(b) for b in fp32.values())
        assert total > 0 and sum(sum(b) for b in bf16.values()) / total == pytest.approx(0.50, abs=0.01)


def test_the_model_receives_bf16_rows_under_bf16_only(runs):
    for rank in range(WORLD):
        for codec in CODECS:
            assert runs[rank][("pooled", "bf16", codec)]["pooled_dtype"] == "torch.bfloat16"
            assert runs[rank][("pooled", "fp32", codec)]["pooled_dtype"] == "torch.float32"
            assert runs[rank][("sequence", "bf16", codec)]["dtype"] == "torch.bfloat16"
            assert runs[rank][("sequence", "fp32", codec)]["dtype"] == "torch.float32"


def test_dedup_forward_is_bitwise_none_under_bf16(runs):
    for rank in range(WORLD):
        none, dedup = runs[rank][("pooled", "bf16", "none")], runs[rank][("pooled", "bf16", "dedup")]
        assert np.array_equal(none["pooled"], dedup["pooled"]), f"rank {rank}: pooled forward differs"
        assert np.array_equal(dedup["split_path_pooled"], none["pooled"])
        none, dedup = runs[rank][("sequence", "bf16", "none")], runs[rank][("sequence", "bf16", "dedup")]
        for f in features():
            assert np.array_equal(none["outputs"][0][f], dedup["outputs"][0][f]), f"rank {rank} {f}"


def test_bf16_rows_are_fp32_rows_rounded_once(runs):
    """Step 1 (equal tables): each bf16 value is the fp32 run's value rounded once to nearest,
    bitwise (row-wise partial sums add a bf16 row to zeros: exact), and not every value
    equals fp32's (a real rounding)."""
    for rank in range(WORLD):
        for kind, pick in (("pooled", lambda r: [r["pooled"]]),
                           ("sequence", lambda r: [r["outputs"][0][f] for f in features()])):
            wide = np.concatenate([a.ravel() for a in pick(runs[rank][(kind, "fp32", "none")])])
            narrow = np.concatenate([a.ravel() for a in pick(runs[rank][(kind, "bf16", "none")])])
            assert np.array_equal(narrow, torch.from_numpy(wide).bfloat16().float().numpy()), (rank, kind)
            assert not np.array_equal(narrow, wide), (rank, kind)


def test_dedup_training_tracks_none_under_bf16(runs):
    """Later steps: `dedup`'s repeated bags' gradients are summed in fp32 and rounded once to
    bf16 where `none` sends each bag's bf16 gradient (precision.py): losses stay within bf16's
    rounding of `none`'s."""
    for rank in range(WORLD):
        for kind in ("pooled", "sequence"):
            none, dedup = runs[rank][(kind, "bf16", "none")], runs[rank][(kind, "bf16", "dedup")]
            np.testing.assert_allclose(dedup["losses"], none["losses"], rtol=2.0 ** -7)
