"""bench_floor.py: the runs alone get the local batch and their own run directories, and the
summary is medians over rounds with ratios to the first contender."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scripts import load_script


def test_runs_alone_split_the_global_batch_and_never_share_a_run_directory():
    script = load_script("bench_floor")
    args = script.parse_args(["--shape", "mlperf", "--world-size", "4", "--vs", "comm.codec=dedup",
                              "optim.lr=0.5"])
    alone = [script.alone_command(args, 2048, i, Path(f"/x/{i}.json")) for i in range(4)]
    for i, command in enumerate(alone):
        assert command[command.index("--world-size") + 1] == "1"
        assert command[-2:] == ["run.global_batch_size=2048", f"run.name=bench_floor_alone{i}"]
        assert "optim.lr=0.5" in command and not any(c.startswith("--vs") for c in command)
    assert len({c[-1] for c in alone}) == 4  # concurrent runs in one directory are refused
    ranks = script.ranks_command(args, Path("/x/r.json"))
    assert ranks[ranks.index("--world-size") + 1] == "4" and "--vs=comm.codec=dedup" in ranks
    assert script.global_batch("mlperf", []) == 8192
    assert "--link-gbit" not in ranks
    shaped = script.parse_args(["--link-gbit", "1", "--vs", "comm.codec=dedup"])
    ranks = script.ranks_command(shaped, Path("/x/r.json"))
    assert ranks[ranks.index("--link-gbit") + 1] == "1.0"
    assert "--link-gbit" not in script.alone_command(shaped, 4096, 0, Path("/x/0.json"))  # sends nothing


def test_summary_takes_medians_over_rounds_and_ratios_to_the_first():
    script = load_script("bench_floor")
    rounds = [{"none": 100.0, "dedup": 80.0, script.ALONE: 70.0},
              {"none": 120.0, "dedup": 90.0, script.ALONE: 60.0},
              {"none": 110.0, "dedup": 85.0, script.ALONE: 65.0}]
    median, ratio = script.summary(rounds)
    assert median == {"none": 110.0, "dedup": 85.0, script.ALONE: 65.0}
    assert ratio == pytest.approx({"dedup": 85 / 110, script.ALONE: 65 / 110})
    assert script.alone_ms([{"ms_per_step": {"dlrmtrain": 10.0}},
                            {"ms_per_step": {"dlrmtrain": 14.0}}]) == 12.0


@pytest.mark.parametrize("argv", [["--world-size", "1"], ["--link-latency-ms", "5"], ["--shape", "mlprf"]])
def test_refused_command_lines(argv):
    """One rank has nothing to compare; a delay without a rate would be dropped; a shape
    bench_train does not have is named, not a traceback."""
    with pytest.raises(SystemExit):
        load_script("bench_floor").parse_args(argv)
