#!/usr/bin/env bash
# Set up if needed, then train the quick-start model on 2 CPU ranks (Gloo).
# Extra arguments are config overrides, e.g. `bash scripts/quickstart.sh comm.codec=none`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec .venv/bin/torchrun --standalone --nproc_per_node 2 -m dlrmtrain.train \
  --config configs/quickstart.yaml run.overwrite=true "$@"
