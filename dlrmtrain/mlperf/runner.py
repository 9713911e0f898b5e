"""Moved to dlrmtrain.mlperf_runner (it validates configs, asks the workloads and draws the
report: the top of the house, above this package); this module only keeps the old command
working: `python -m dlrmtrain.mlperf.runner ARGS` runs `python -m dlrmtrain.mlperf_runner ARGS`
(the figures in docs/performance.md were recorded with the old form)."""

if __name__ == "__main__":
    from dlrmtrain.testbed import run_moved

    run_moved("dlrmtrain.mlperf.runner", "dlrmtrain.mlperf_runner")
