"""Two-level dedup (`comm.hierarchy: node`): shared.py (the plan and the per-node uniques),
node_ids.py (the node's id exchange), table_wise.py and row_wise.py (the planners), transport.py
(the autograd pair and `two_level_route`). Re-exports nothing."""
