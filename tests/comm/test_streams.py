"""Stream safety of the codec's plans, without ranks (issue 26 item 3; the real plans of every
planner are checked in the spawned runs of test_host_syncs.py and test_two_level.py).

A plan made ahead on the data-dist stream is used on the default one; its `record_stream`
must reach every tensor it holds, those of deferred work in a closure too (checked against
the tensors the garbage collector finds, `stream_check.reachable_tensors`). The transport's
autograd dummy lives on the data's device, and TorchRec's pipeline sees the KJT all-to-all
behind the recording input dist (so it fuses the split exchanges).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.comm import streams
from dlrmtrain.comm.dedup.plan import DedupPlan, PlannedAhead
from dlrmtrain.comm.stats import DistCommStats
from dlrmtrain.comm.torchrec.pooled import _RecordingInputDist
from tests.comm.stream_check import STREAM, observed_records, reachable_tensors, unrecorded


@dataclass
class _Step:
    kjt: KeyedJaggedTensor
    extra: dict


def _deferred_plan() -> DedupPlan:
    """A plan whose last index is built later by a closure over a step's KJT, a cache of aranges,
    a nested helper and a list of tensors, the way two_level.py defers stage 2."""
    kjt = KeyedJaggedTensor.from_lengths_sync(["f"], torch.tensor([1, 2, 0, 3]), torch.tensor([1, 2]),
                                              weights=torch.ones(6))
    step = _Step(kjt, {"inverse": torch.arange(4)})
    ar = {2: torch.arange(2)}
    inverses = [torch.arange(3), torch.zeros(2, dtype=torch.int64)]

    def units(base: torch.Tensor) -> torch.Tensor:
        return (base.unsqueeze(1) + ar[2]).reshape(-1)

    def deferred() -> torch.Tensor:
        return units(torch.cat(inverses + [step.extra["inverse"], step.kjt.values()]))

    plan = DedupPlan(2, torch.arange(4), torch.arange(6), [4, 4], [6, 2], (2, 4), pad_units=1)
    plan.deferred = deferred  # as TwoLevelPlan.deferred
    return plan


def test_a_plans_record_stream_reaches_every_tensor_it_holds_closures_included():
    plan = _deferred_plan()
    found, missed = unrecorded(plan)
    assert found == 9 and missed == 0  # 2 fields; in the cells 4 tensors and the KJT values, lengths, weights
    # what the plan waits in under the pipeline, and a container of both, the same way
    ahead = PlannedAhead(plan, 4, DistCommStats(codec="dedup", sharding_type="table_wise"), 0.0)
    assert unrecorded(ahead) == (found, 0)
    # every tensor once, in one walk, cycles included
    plan.back = plan
    assert len(streams.held_tensors(plan)) == len({id(t) for t in reachable_tensors(plan)}) == found


def test_record_tensor_is_a_no_op_without_streams_and_current_stream_is_none_on_cpu():
    t = torch.ones(2)
    streams.record_tensor(t, STREAM)  # CPU memory: no streams, no call into CUDA
    assert streams.current_stream(torch.device("cpu")) is None
    with observed_records() as calls:
        streams.record_stream({"a": [t, (t,)]}, STREAM)
    assert [(x is t, s is STREAM) for x, s in calls] == [(True, True)]


def test_the_transports_autograd_dummy_lives_on_the_datas_device():
    from dlrmtrain.comm.dedup.transport import new_request

    plan = DedupPlan(1, torch.arange(2), torch.arange(2), [2], [2], (2, 1))
    req = new_request(torch.empty(4, 1, device="meta"), plan, owner=None)
    assert req.dummy.device.type == "meta" and req.dummy.requires_grad


class _WithDist(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self._dist = nn.Identity()

    def forward(self, x):
        return x


def test_the_recording_input_dist_shows_torchrecs_pipeline_the_kjt_all_to_all():
    inner = _WithDist()
    recorder = _RecordingInputDist(inner)
    assert hasattr(recorder, "_dist") and recorder._dist is inner._dist
    assert not hasattr(_RecordingInputDist(nn.Identity()), "_dist")  # nothing to fuse: hasattr is False
