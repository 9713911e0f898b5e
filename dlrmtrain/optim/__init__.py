"""Optimizers (dense: optimizers.py; the fused embedding kernel's: fused.py) and the MLPerf learning-rate schedule."""
