"""The lossless `auto` codec: per all-to-all (and per table) `none` or `dedup`, whichever measures faster.

policy.py decides (no torch); dist.py (`AutoDist`) applies the decisions; codec.py (`AutoCodec`) builds it;
source.py (`SourceAuto`, `AutoSampleSide`) applies them per batch where the batch is made (comm/placement.py).
"""
