"""The lossless `auto` codec: per all-to-all (and per table) `none` or `dedup`, whichever measures faster.

policy.py decides (no torch); codec.py (`AutoCodec`, `AutoDist`) applies the decisions.
"""
