"""Codecs on the sequence-embedding all-to-all of a sharded EmbeddingCollection (DLRMv4, HSTU).

layout.py: which table and owner rank every feature of one sequence sharding
has, on both ends; planner.py: `SequencePlanner`, the dedup planner for
unpooled rows (one per id position), run by the pooled path's `DedupDist`;
sharder.py: the EC sharder that installs it. Nothing is re-exported here.
"""
