"""Optimizers (dense + fused embedding) and the MLPerf learning-rate schedule."""
