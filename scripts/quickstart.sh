#!/usr/bin/env bash
# The README's main job, on a fresh machine: set up .venv, plan Llama-3 70B on 16 DGX H100 nodes
# (the files you would commit and submit), then plan the tiny model for this machine and train
# it for 30 steps on real text through `dsorch submit --cluster local`: 4 CPU ranks over gloo,
# the same entrypoint and job machinery a SLURM cluster runs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
source .venv/bin/activate
export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}" OMP_NUM_THREADS=1

dsorch plan examples/llama3-70b.yaml --cluster dgx16 --out plans/llama70b-dgx16
dsorch submit plans/llama70b-dgx16 --dry-run | head -n 20

dsorch plan examples/tiny.yaml --cluster local --out plans/tiny
dsorch submit plans/tiny --data examples/data/pydoc --wait
dsorch status
job="$(dsorch status --json | python -c 'import json,sys; print(json.load(sys.stdin)[-1]["job_id"])')"
dsorch logs "$job" | grep -E '^step +(1|10|20|30) ' || true
