"""The codec layer between the embedding lookup and the pooled-embedding all-to-all.

`make_ebc_sharder` (embeddingbag.py) is what the rest of dlrmtrain calls: it returns
TorchRec's stock sharder for `none` and a sharder whose sharded module swaps the
output dist per table for the others. Codecs are registered by name
(registry.py); per-table byte and time counters live in stats.py.
"""
