"""Codecs between the embedding output and the all-to-all."""
