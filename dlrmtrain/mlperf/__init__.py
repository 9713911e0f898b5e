"""MLPerf submission tooling: the :::MLLOG logger, benchmark facts, the compliance
checker with (unofficial) rules, scoring, the submission layout, the runner and the
series it keeps resumable in its `--out` (series.py)."""
