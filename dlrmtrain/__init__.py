"""dlrmtrain: DLRM training with lossless embedding all-to-all compression."""
