"""The codec layer between the embedding lookup and the pooled-embedding all-to-all.

`Placement` (placement.py) is what the rest of dlrmtrain asks: where the run's codec runs,
and its sharder (TorchRec's stock one for `none`, else one whose sharded module swaps the
output dist per table for the others). Codecs are registered by name
(registry.py); per-table byte and time counters live in stats.py.
"""
