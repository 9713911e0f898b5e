"""DLRMv4 data: Yambda music events (and a calibrated Yambda-like generator) as `SequenceBatch`es.

Mirrors the MLPerf reference's data path (mlcommons/training recommendation_v4, PR #889).
One concept per module:

- events.py       event encoding, the three pools, the temporal split, sessions
- parquet.py      Yambda's parquet files (pyarrow, the optional `yambda` extra)
- preprocess.py   parquet → the prepared flat store (streaming; `dlrmtrain preprocess-yambda`)
- store.py        the prepared store on disk, memory-mapped
- history.py      LISTEN anchors and the three-pool / last_n history
- cross_hash.py   the hashed crosses (the reference's xxh64, vectorised) and the uid hash
- samples.py      a prepared dataset's samples: windows, holdout, features
- synthetic.py    the Yambda-like generator; calibration.py its unique-rate calibration
- batch.py        per-sample columns → SequenceBatch
- loader.py       rank slices, last-batch policy, resumption, prefetch
- builder.py      build_yambda_loaders (what the trainer calls); checks.py the config rules
"""


__all__ = ["YambdaLoaders", "build_yambda_loaders"]


def __getattr__(name: str):
    # Lazy, so `python -m dlrmtrain.data.yambda.<cli module>` does not import that module twice.
    if name in __all__:
        from dlrmtrain.data.yambda import builder
        return getattr(builder, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
