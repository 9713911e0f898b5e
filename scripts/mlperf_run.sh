#!/usr/bin/env bash
# MLPerf time-to-train reproduction, codec none and dedup side by side (2 CPU ranks, Gloo).
# Seeded runs (5 dlrm / 10 dlrm_dcnv2 per codec) → results/ + systems/, checked, scored, ratio.
#   bash scripts/mlperf_run.sh          # configs/mini_mlperf.yaml on the real Criteo sample
#   bash scripts/mlperf_run.sh --config C --out D [--codecs none,dedup] [--runs N] [key=value ...]
# With no arguments it first preprocesses the sample (from $DLRMTRAIN_SHARED_DATA, default
# the shared folder beside the checkout) into data/criteo_kaggle_sample unless that exists.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
if [[ $# -eq 0 ]]; then
  if [[ ! -f data/criteo_kaggle_sample/dataset.json ]]; then
    .venv/bin/python data_prep/preprocess.py --mode mlperf_vocab --out data/criteo_kaggle_sample \
      "${DLRMTRAIN_SHARED_DATA:-../shared/data}/criteo_kaggle_sample.tsv.gz"
  fi
  set -- --config configs/mini_mlperf.yaml --out runs/mlperf_mini
fi
exec .venv/bin/python -m dlrmtrain.mlperf.runner "$@"
