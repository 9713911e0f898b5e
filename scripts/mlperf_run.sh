#!/usr/bin/env bash
# MLPerf time-to-train reproduction, codecs none, dedup and auto side by side (2 CPU ranks, Gloo).
# Seeded runs (5 dlrm / 10 dlrm_dcnv2 per codec) → results/ + systems/, checked, scored, ratio,
# and plots of every run in <out>/report/.
#   bash scripts/mlperf_run.sh [--data /path/to/criteo_kaggle_sample.tsv.gz]
#       configs/mini_mlperf.yaml on real Criteo data: the file given, else
#       $DLRMTRAIN_SHARED_DATA/criteo_kaggle_sample.tsv.gz; preprocessed once into
#       data/criteo_kaggle_sample. Without either it says where Criteo's data comes from
#       and runs the same flow on the calibrated synthetic `kaggle` profile.
#   bash scripts/mlperf_run.sh --config C --out D [--codecs none,dedup,auto] [--runs N] [key=value ...]
#       anything else goes to `dlrmtrain mlperf` as is.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
DLRMTRAIN=(.venv/bin/python -m dlrmtrain)

if [[ $# -eq 0 || "$1" == "--data" ]]; then
  SAMPLE=""
  if [[ "${1:-}" == "--data" ]]; then
    SAMPLE="${2:?--data needs a file}"
    [[ -f "$SAMPLE" ]] || { echo "mlperf_run: --data $SAMPLE: no such file" >&2; exit 2; }
  elif [[ -n "${DLRMTRAIN_SHARED_DATA:-}" && -f "$DLRMTRAIN_SHARED_DATA/criteo_kaggle_sample.tsv.gz" ]]; then
    SAMPLE="$DLRMTRAIN_SHARED_DATA/criteo_kaggle_sample.tsv.gz"
  fi
  if [[ -n "$SAMPLE" ]]; then
    if [[ ! -f data/criteo_kaggle_sample/dataset.json ]]; then
      "${DLRMTRAIN[@]}" preprocess --mode mlperf_vocab --out data/criteo_kaggle_sample "$SAMPLE"
    fi
    set -- --config configs/mini_mlperf.yaml --out runs/mlperf_mini
  else
    cat <<'MSG'
mlperf_run: no Criteo data given (--data FILE or $DLRMTRAIN_SHARED_DATA).
  Criteo's click logs: https://ailab.criteo.com/ressources/ (Kaggle Display Advertising
  Challenge, research use; Criteo 1TB Click Logs, CC BY-NC-SA 4.0). Any Criteo text file
  works with --data (mini_mlperf.yaml was tuned on a 49,285-row sample of the Kaggle data).
  Running the same flow on the calibrated synthetic `kaggle` profile instead
  (same table sizes and id skew as that sample; labels from a hidden teacher),
  with its own target AUC 0.635: this task's ceiling is lower than the real one.
MSG
    # The sample's split sizes (39,424 train / 9,856 eval). Target: seed 0 reached 0.639 after
    # 1.6 epochs and levels off at 0.649 (measured, codec none), as the real sample reaches 0.70.
    set -- --config configs/mini_mlperf.yaml --out runs/mlperf_mini_synthetic data=synthetic \
      data.synthetic.num_train_samples=39424 data.synthetic.num_eval_samples=9856 \
      eval.target_auc=0.635
  fi
fi
exec "${DLRMTRAIN[@]}" mlperf "$@"
