#!/usr/bin/env bash
# Set up if needed, then run the test suite. Extra arguments go to pytest.
# Three pytest workers (pytest-xdist) on the two cores: most of the suite's wall time is
# real processes starting (torch + torchrec imports, torchrun agents) and multi-rank
# tests waiting on each other or on a fault's timeout, so one worker leaves a core idle
# (16.5 min at 99% of one core). `-n 0` runs serially; a later `-n N` overrides this one.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "${DLRMTRAIN_TEST_WORKERS:-3}" --dist worksteal "$@"
