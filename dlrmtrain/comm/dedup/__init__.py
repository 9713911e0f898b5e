"""The lossless `dedup` codec: only distinct pooled rows cross the embedding all-to-all.

codec.py (`DedupCodec`, the registry entry) picks a planner per sharding type:
table_wise.py or row_wise.py. dist.py (`DedupDist`) runs a planner each step;
plan.py holds what they pass each other (`DedupStep` in, `DedupPlan` out);
transport.py carries a plan's all-to-all; kernels.py and buffers.py are the
torch-only work under it, expand.py the expand's autograd math at the source. Nothing is re-exported here: importing
`dlrmtrain.comm.dedup.kernels` must not pull in TorchRec (scripts/bench_codec_kernels.py).
"""
