#!/usr/bin/env bash
# Set up if needed, then train the quick-start model on 2 CPU ranks (Gloo).
# Extra arguments are config overrides, e.g. `bash scripts/quickstart.sh comm.codec=dedup`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# A fresh run each time (run.overwrite=true), unless asked to resume one (the two are refused together).
overwrite=run.overwrite=true
for arg in "$@"; do [[ "$arg" == checkpoint.resume=true ]] && overwrite=run.overwrite=false; done
exec .venv/bin/dlrmtrain train --nproc 2 --config configs/quickstart.yaml "$overwrite" "$@"
