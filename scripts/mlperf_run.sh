#!/usr/bin/env bash
# MLPerf time-to-train reproduction, codec none and dedup side by side (2 CPU ranks, Gloo).
# Seeded runs (5 dlrm / 10 dlrm_dcnv2 per codec) → results/ + systems/, checked, scored, ratio.
#   bash scripts/mlperf_run.sh                       # configs/mini_mlperf.yaml → runs/mlperf_mini
#   bash scripts/mlperf_run.sh --config C --out D [--codecs none,dedup] [--runs N] [key=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
if [[ $# -eq 0 ]]; then
  set -- --config configs/mini_mlperf.yaml --out runs/mlperf_mini
fi
exec .venv/bin/python -m dlrmtrain.mlperf_runner "$@"
