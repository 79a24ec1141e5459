#!/usr/bin/env bash
# Create (or reuse) .venv with everything dsorch and its tests need. Idempotent; a second run
# takes a few seconds.
#
# torch is installed before deepspeed and pinned to 2.13.0: that is the CPU build this kind of
# machine has on disk. An unpinned torch makes pip download a multi-GB CUDA build; on a GPU
# cluster install the torch build your CUDA needs first, then `pip install -e .`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
  # The interpreter itself, not the link that found it on PATH: a venv's python points at the path
  # it was made from, and a link in a temporary directory (a test's PATH) would leave it dangling.
  PY="$("$PY" -c 'import os, sys; print(os.path.realpath(sys.executable))')"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
if ! "$VPY" -c "import torch" 2>/dev/null; then
  "$VPY" -m pip install --quiet --upgrade pip
  "$VPY" -m pip install --quiet "torch==${DSORCH_TORCH_VERSION:-2.13.0}"
fi
if ! "$VPY" -c "import orchestrator, deepspeed, pytest, hypothesis, ruff, mypy" 2>/dev/null \
   || [[ pyproject.toml -nt .venv/.dsorch-installed ]]; then
  "$VPY" -m pip install --quiet -e ".[test,lint,docs]"
  touch .venv/.dsorch-installed
fi
echo "dsorch $("$VPY" -c 'import orchestrator; print(orchestrator.__version__)') ready in .venv (activate: source .venv/bin/activate)"
