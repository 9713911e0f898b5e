"""Every rank stops after the same logging step when one of them gets a stop signal
(run/stop.py, issue 26): on NCCL a rank that left alone would leave its peers hanging in
their next collective. Two real ranks share the job's store; the logging all-reduce is a
real Gloo all-reduce. The end-to-end job (SIGTERM to one rank of `dlrmtrain train`) is
tests/reliability/test_run_lifecycle.py."""

from __future__ import annotations

import signal

import pytest

from dlrmtrain.run.stop import StopAtLoggingSteps
from tests.multiproc import run_ranks

TERM = int(signal.SIGTERM)


@pytest.mark.parametrize("signalled_at, every, stops_at", [
    (3, 5, 5), (5, 5, 10), (19, 5, 20), (7, 1, 8),
])
def test_a_signal_stops_the_run_at_the_next_logging_step_ahead(signalled_at, every, stops_at):
    stops = StopAtLoggingSteps(total=20, every=every)  # a world of one: no store
    stopped = [step for step in range(1, 21)
               if stops.after_step(step, TERM if step >= signalled_at else None)]
    assert stopped[0] == stops_at
    assert stops.after_step(stops_at, TERM) == {"exit_code": 128 + TERM, "stop_at": stops_at, "rank": 0}


def test_a_signal_at_the_planned_last_step_lets_the_run_end():
    stops = StopAtLoggingSteps(total=20, every=5)
    assert stops.after_step(20, TERM) is None


def _steps_until_stopped(rank: int, world_size: int, scenarios: dict) -> dict:
    """Each scenario: {rank: the step its signal arrives at}; every step ends in the
    logging all-reduce, then the stop check. Returns the step each scenario stopped at."""
    import os

    import torch
    import torch.distributed as dist

    stopped = {}
    for attempt, (name, signalled) in enumerate(scenarios.items()):
        os.environ["TORCHELASTIC_RESTART_COUNT"] = str(attempt)  # a fresh attempt: its own request
        stops = StopAtLoggingSteps(total=40, every=4)
        for step in range(1, 41):
            dist.all_reduce(torch.ones(1))  # the logging all-reduce (every step: a collective)
            got = signalled.get(rank)
            request = stops.after_step(step, TERM if got is not None and step >= got else None)
            if request is not None:
                stopped[name] = (step, request["rank"])
                break
    return stopped


SCENARIOS = {
    "rank 1 alone": {1: 6},            # asks for step 8, rank 0 sees it there
    "rank 1 at a logging step": {1: 8},  # after the all-reduce of step 8: the next one, 12
    "both, one step apart": {0: 13, 1: 14},  # the first request wins: step 16, rank 0's
    "both, a window apart": {1: 17, 0: 21},  # rank 1 asked for 20; rank 0 stops there too
}


def test_every_rank_stops_after_the_same_step_through_the_jobs_store():
    results = run_ranks(_steps_until_stopped, 2, SCENARIOS, timeout=120)
    assert results[0] == results[1]  # same step, same request, on both ranks
    assert results[0] == {"rank 1 alone": (8, 1), "rank 1 at a logging step": (12, 1),
                          "both, one step apart": (16, 0), "both, a window apart": (20, 1)}
