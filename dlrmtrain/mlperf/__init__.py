"""MLPerf submission tooling: the :::MLLOG logger, benchmark facts, the compliance
checker with (unofficial) rules, scoring, the submission layout, and the series the
runner (dlrmtrain/mlperf_runner.py, above the workloads this package sits below) keeps
resumable in its `--out` (series.py)."""
