"""What run/peers.py reads in a broken collective's error, and how a stall is counted.

The Gloo texts are the ones real 2-rank jobs print (test_peer_failures.py meets them
live); the NCCL ones are ProcessGroupNCCL's (a CPU machine cannot raise them).
"""

from __future__ import annotations

import pytest

from dlrmtrain.run.errors import CheckpointWriteError
from dlrmtrain.run.peers import _merged, backend_failure
from dlrmtrain.run.progress import Summary

GLOO = "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] "


@pytest.mark.parametrize("text, kind, words", [
    (GLOO + "Read error [127.0.0.1]:24483: Connection reset by peer. This is typically caused "
     "by a remote worker hanging or bugs in the application.", "lost connection",
     "Read error [127.0.0.1]:24483: Connection reset by peer"),
    ("Application timeout caused pair closure", "timeout",
     "Application timeout caused pair closure"),
    ("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 10000ms "
     "for recv operation to complete", "timeout",
     "Timed out waiting 10000ms for recv operation to complete"),
    ("NCCL communicator was aborted on rank 0. Original reason for failure was: [Rank 0] "
     "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLTOALL_BASE) "
     "ran for 300012 milliseconds before timing out.", "timeout", None),
    ("NCCL communicator was aborted on rank 1.", "lost connection",
     "NCCL communicator was aborted on rank 1."),
])
def test_a_backends_words_for_a_lost_or_silent_peer_are_read(text, kind, words):
    found = backend_failure(RuntimeError(text))
    assert found is not None and found[0] == kind
    if words is not None:
        assert found[1] == words


def test_a_wrapped_backend_error_is_found_through_its_cause():
    try:
        try:
            raise RuntimeError("Application timeout caused pair closure")
        except RuntimeError as e:
            raise ValueError("while gathering the eval outputs") from e
    except ValueError as wrapped:
        assert backend_failure(wrapped)[0] == "timeout"


@pytest.mark.parametrize("error", [
    RuntimeError("DataLoader timed out after 5 seconds"),   # not a backend's
    RuntimeError("The size of tensor a (16384) must match the size of tensor b (16199)"),
    CheckpointWriteError("checkpoint of step 4 could not be written (gloo: timed out)"),  # ours
    OSError("Connection reset by peer"),                    # not a collective's
])
def test_other_errors_are_not_read_as_a_peers(error):
    assert backend_failure(error) is None


def test_overlapping_silences_count_once():
    assert _merged([(5.0, 7.0), (1.0, 3.0), (2.0, 4.0)]) == [(1.0, 4.0), (5.0, 7.0)]


def test_the_summary_shows_stalled_time_apart_from_the_throughput():
    summary = Summary(world_size=2, samples=1000, train_seconds=2.0, wall_seconds=10.0,
                      stalled_seconds=8.0)
    assert summary.samples_per_second == 500
    assert summary.as_dict()["stalled_seconds"] == 8.0
    assert "stalled          8.0 s with a rank silent (not in the training time)" in summary.render()
    assert "stalled" not in Summary(world_size=2).render()


def test_a_cuda_group_reads_nccls_errors_in_the_training_thread(monkeypatch):
    """CleanUpOnly (2), not torch's default 3: the watchdog aborts the communicators and the
    error reaches Python, where peers.py names it; a setting in the environment wins."""
    from dlrmtrain.distributed.env import backend_for, nccl_error_env

    import torch

    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    monkeypatch.setenv("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "600")
    env = nccl_error_env(backend_for(torch.device("cuda", 0)))
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"
    assert env["TORCH_NCCL_ENABLE_MONITORING"] == "1"
    assert "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC" not in env  # the user's 600 stays
    assert nccl_error_env(backend_for(torch.device("cpu"))) == {}
