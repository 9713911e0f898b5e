"""Metrics: exact ROC AUC over the whole eval set and the step-time breakdown."""
