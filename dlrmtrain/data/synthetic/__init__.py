"""Synthetic Criteo-like data: the generator, its calibrated profiles, and writing it to disk."""
