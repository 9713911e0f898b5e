"""Metrics: exact ROC AUC over the whole eval set, run-directory records, the step-time breakdown."""
