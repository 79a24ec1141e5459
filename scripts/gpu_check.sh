#!/usr/bin/env bash
# The one GPU check (issue 15): the GPU-marked tests, then scripts/gpu_check.py (the entrypoint on a
# ~1B model for six one-GPU layouts, measured against dsorch's predictions; a records file in
# `dsorch calibrate` format under docs/measurements/). Under 8 minutes on one H200; needs no network.
#   scripts/gpu_check.sh              on the GPU machine, from the repository root
#   scripts/gpu_check.sh --dry-run    anywhere: everything but the GPU (a small model on a CPU rank)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
if [[ "${1:-}" == "--dry-run" ]]; then
  "$PY" scripts/gpu_check.py "$@"
  exit 0
fi
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA GPU: use --dry-run")'
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
timeout 150 "$PY" -m pytest -q -m gpu tests/system/test_gpu.py || echo "gpu tests failed (above); measuring anyway"
"$PY" scripts/gpu_check.py "$@"
