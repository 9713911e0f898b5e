"""Data: sources of samples and their per-rank batches.

Two kinds of source, one builder each (which kind a model reads is its workload's
choice, dlrmtrain/workloads/). `build_row_datasets`: the row sources, a list of Parts
(parts.py) read by one loader (loader.py; batches made ahead by prefetch.py, as yambda/'s are): `criteo` files in any layout (formats/,
opened by sources.py, split by splits.py) or `synthetic` rows generated in memory
(synthetic/). `build_sequence_datasets`: the sequence sources (`yambda`,
`synthetic_yambda`) read by yambda/ (`SequenceBatch`es). preprocess/ is the offline
step (data_prep/); checks.py holds the data section's config rules.

Builders and the Datasets record live in datasets.py, not here: importing this package
(every `dlrmtrain preprocess` process does) stays free of torch and torchrec.
"""
