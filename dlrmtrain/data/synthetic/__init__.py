"""Synthetic Criteo-like data: the generator, its calibrated profiles, the `synthetic`
source (generated rows read by the file loader) and writing it to disk."""
