"""`comm.codec: auto` at the source (comm/auto/source.py) on one process: the step takes the form
of the batch its path says, the probe times both, the decision keeps the faster one, and
evaluation batches take the current choice. On real ranks through the trainer:
tests/multiproc/test_trainer_codec.py."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch

from dlrmtrain.comm.auto.policy import AutoPolicy
from dlrmtrain.comm.auto.source import SourceAuto, distinct_fraction, rows_of_both_forms
from dlrmtrain.comm.dedup.source import distinct_bags
from dlrmtrain.data.loader import block_to_batch
from dlrmtrain.data.parts import RowBlock


def both_forms(rows: int = 8):
    sparse = np.tile(np.arange(rows, dtype=np.int64)[:, None] % 2, (1, 26))  # two distinct ids per feature
    batch = block_to_batch(RowBlock(np.zeros((rows, 13), np.float32), sparse, np.zeros(rows, np.float32)))
    return dataclasses.replace(batch, distinct_features=distinct_bags(batch.sparse_features))


@pytest.mark.parametrize("in_flight", [0, 2], ids=["plain loop", "pipeline"])
def test_each_step_takes_its_paths_form_and_the_faster_path_stays(in_flight):
    """`in_flight`: batches a pipeline takes before their step (picked by the path ahead)."""
    batch = both_forms()
    assert distinct_fraction(batch) == pytest.approx(2 / 8)
    auto = SourceAuto(AutoPolicy(warmup_steps=1, probe_steps=2, min_probe_steps=2), torch.device("cpu"))
    assert not auto.pick_for_eval(batch).sparse_features.variable_stride_per_key()  # none while probing
    queue = [auto.pick(batch) for _ in range(in_flight)]
    forms = []
    for _ in range(8):
        queue.append(auto.pick(batch))
        step = queue.pop(0)
        assert step.distinct_features is None  # the step holds one form only
        deduped = step.sparse_features.variable_stride_per_key()
        forms.append("dedup" if deduped else "none")
        if not deduped:
            time.sleep(0.02)  # the none step is the slow one here
        auto.step_ended()
    # warm-up (dedup, untimed: no step ended before it), the probe alternating from dedup, then
    # the decision at the end of the fifth step keeps dedup; the batches a pipeline picked
    # before it keep the probe's forms (dedup, none), then dedup
    after = ["dedup", "none"] if in_flight else ["dedup", "dedup"]
    assert forms == ["dedup", "dedup", "none", "dedup", "none", *after, "dedup"]
    assert auto.policy.choice == "dedup" and len(auto.decisions) == 1
    assert auto.counted_bytes().decisions == auto.decisions
    assert auto.pick_for_eval(batch).sparse_features.variable_stride_per_key()


def test_a_period_that_held_an_evaluation_is_not_timed():
    auto = SourceAuto(AutoPolicy(warmup_steps=1, probe_steps=2, min_probe_steps=2), torch.device("cpu"))
    batch = both_forms()
    for _ in range(2):
        auto.pick(batch)
        auto.step_ended()
    auto.pick(batch)
    auto.pick_for_eval(batch)
    auto.step_ended()
    assert sum(len(v) for v in auto.policy._samples.values()) == 1  # step 1 only; step 2 held the eval


def test_a_batch_without_its_distinct_bags_is_refused_by_name():
    auto = SourceAuto(AutoPolicy(), torch.device("cpu"))
    with pytest.raises(ValueError, match="comm.codec: auto with comm.dedup_at: source needs batches"):
        auto.pick(dataclasses.replace(both_forms(), distinct_features=None))


def test_a_sequence_batch_carries_both_forms_and_each_step_takes_one():
    """DLRMv4: the sequence loader keeps `sparse` whole and its distinct ids (`DistinctIdsKJT`)
    beside it; the fraction is distinct ids / positions; a step holds one form only."""
    from dlrmtrain.comm.dedup.sequence_source import DistinctIdsKJT, SequenceSourceDedup
    from dlrmtrain.sequence_features import SequenceBatch
    from tests.comm.test_sequence_source import SEQS, SHARDINGS, _kjt

    full = _kjt(SEQS)
    batch = SequenceBatch(full, full, full, SequenceSourceDedup(SHARDINGS)(full)).to(torch.device("cpu"))
    assert isinstance(batch.distinct_sparse, DistinctIdsKJT)
    # 16 positions, 14 through a sharding (x has none: sent in neither form); sent: T's 3
    # distinct, U's 2, d's 2 whole
    assert rows_of_both_forms(batch) == (14, 7) and distinct_fraction(batch) == pytest.approx(7 / 14)
    auto = SourceAuto(AutoPolicy(warmup_steps=1, probe_steps=1, min_probe_steps=1, margin=-100.0),
                      torch.device("cpu"))
    forms = []
    for _ in range(5):
        step = auto.pick(batch)
        assert step.distinct_sparse is None
        forms.append("dedup" if isinstance(step.sparse, DistinctIdsKJT) else "none")
        auto.step_ended()
    assert forms == ["dedup", "dedup", "none", "dedup", "dedup"] and auto.policy.choice == "dedup"
    assert not isinstance(SourceAuto(AutoPolicy(), torch.device("cpu")).pick_for_eval(batch).sparse, DistinctIdsKJT)


def test_the_trainers_source_auto_takes_the_runs_comm_auto():
    """The placement's `feed` (what the Trainer calls) builds the picker's policy from comm.auto."""
    from dlrmtrain.comm.placement import Placement
    from dlrmtrain.config.schema import AutoConfig, CommConfig

    class Loader:  # what the call asks of the run's data: the batch transform
        def set_sparse_transform(self, transform, keep_full: bool) -> None:
            self.keep_full = keep_full

    comm = CommConfig(codec="auto", dedup_at="source", auto=AutoConfig(probe_steps=3, margin=0.2, drift_samples=5))
    data = Loader()
    placement = Placement(comm, "pooled")
    auto = placement.feed(torch.nn.Linear(1, 1), data, torch.device("cpu"))
    assert data.keep_full and auto.policy == AutoPolicy.of(comm.auto) != AutoPolicy()
    assert list(placement.counters) == [auto]  # its decisions join the run's comm stats
