"""Moved to dlrmtrain.testbed.sim_nodes; this module only keeps the old command working:
`python -m dlrmtrain.distributed.sim_nodes ARGS` runs `python -m dlrmtrain.testbed.sim_nodes ARGS`
(the figures in docs/performance.md were recorded with the old form)."""

if __name__ == "__main__":
    from dlrmtrain.testbed import run_moved

    run_moved("dlrmtrain.distributed.sim_nodes", "dlrmtrain.testbed.sim_nodes")
