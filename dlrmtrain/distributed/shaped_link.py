"""Moved to dlrmtrain.testbed.shaped_link; this module only keeps the old command working:
`python -m dlrmtrain.distributed.shaped_link ARGS` runs `python -m dlrmtrain.testbed.shaped_link ARGS`
(the figures in docs/performance.md were recorded with the old form)."""

if __name__ == "__main__":
    from dlrmtrain.testbed import run_moved

    run_moved("dlrmtrain.distributed.shaped_link", "dlrmtrain.testbed.shaped_link")
