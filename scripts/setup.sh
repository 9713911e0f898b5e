#!/usr/bin/env bash
# Create .venv in the repo and install the pinned dlrmtrain stack.
#   bash scripts/setup.sh          CPU stack (torch CPU wheel + fbgemm-gpu-cpu)
#   bash scripts/setup.sh --gpu    CUDA stack (torch CUDA build + fbgemm-gpu)
# Idempotent: when .venv already holds the same pins it returns in seconds.
set -euo pipefail

cd "$(dirname "$0")/.."
VENV=.venv
FLAVOR=cpu
[[ "${1:-}" == "--gpu" ]] && FLAVOR=gpu

# Exact pins. torchrec goes in with --no-deps: its metadata asks for the CUDA
# fbgemm-gpu, which would clash with fbgemm-gpu-cpu; its real needs go in first.
TORCH=torch==2.13.0
FBGEMM_CPU=fbgemm-gpu-cpu==1.8.0
FBGEMM_GPU=fbgemm-gpu==1.8.0
TORCHREC=torchrec==1.8.0
# DLRMv4's jagged attention kernels: on CPU the tests run them under TRITON_INTERPRET=1,
# at the version a lent GPU machine has (3.6); a CUDA torch brings the triton it was built with.
TRITON_CPU=triton==3.6.0
TORCHREC_DEPS=(tensordict==0.15.3 torchmetrics==1.0.3 pyre-extensions==0.0.32 iopath==0.1.10)
OTHERS=(mlperf-logging==4.1.68 numpy==2.4.6 pyyaml==6.0.4 tqdm==4.70.1 matplotlib==3.11.2
        pytest==9.2.0 pytest-timeout==2.4.0 pytest-xdist==3.8.0
        pyarrow==26.0.1)  # the yambda extra: Yambda parquet (tests write tiny files)

STAMP="$VENV/.dlrmtrain-setup-$FLAVOR"
PINS="$TORCH $FBGEMM_CPU $FBGEMM_GPU $TRITON_CPU $TORCHREC ${TORCHREC_DEPS[*]} ${OTHERS[*]} $(sha1sum pyproject.toml | cut -c1-12)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$PINS" ]]; then
  exit 0
fi

[[ -d "$VENV" ]] || python3 -m venv "$VENV"
pip_install() {
  # pip warns once per package about this machine's empty local index
  # folders; drop that noise, keep every real message.
  "$VENV/bin/python" -m pip --disable-pip-version-check -q install "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
}
if [[ "$FLAVOR" == gpu ]]; then
  # CUDA 12.x build of torch from the PyTorch index, then the CUDA fbgemm.
  pip_install "$TORCH" --index-url https://download.pytorch.org/whl/cu128
  pip_install "$FBGEMM_GPU" --index-url https://download.pytorch.org/whl/cu128
else
  pip_install "$TORCH" "$FBGEMM_CPU" "$TRITON_CPU"
fi
pip_install "${TORCHREC_DEPS[@]}" "${OTHERS[@]}"
# torchrec last: an install with dependencies after it would re-check torchrec's
# metadata (it depends on tensordict & co.) and print pip's resolver ERROR about
# the CUDA fbgemm-gpu; --no-deps installs skip that check.
pip_install --no-deps "$TORCHREC"
pip_install --no-deps -e .
echo "$PINS" > "$STAMP"
echo "setup: $VENV ready ($FLAVOR)"
