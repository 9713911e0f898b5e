"""MLPerf submission tooling: the :::MLLOG logger, benchmark facts, the compliance
checker with (unofficial) rules, scoring, the submission layout and the runner."""
