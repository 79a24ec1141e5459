#!/usr/bin/env bash
# The README's main job, on a fresh machine (no SLURM needed): set up .venv, make an experiment
# directory with `dsorch init`, plan Llama-3 70B on 16 DGX H100 nodes (the files you would commit
# and submit) and print the sbatch script `dsorch submit` would queue, then plan the tiny model for
# this machine and train it for 30 steps on real text through `dsorch submit --cluster local`:
# 4 CPU ranks over gloo, the same entrypoint and job machinery a SLURM cluster runs.
#
# The experiment directory is quickstart/ in the checkout (DSORCH_QUICKSTART_DIR overrides it);
# running this again reuses it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
bash scripts/setup.sh
source .venv/bin/activate
export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}" OMP_NUM_THREADS=1

EXP="${DSORCH_QUICKSTART_DIR:-$ROOT/quickstart}"
mkdir -p "$EXP"
cd "$EXP"
[[ -f dsorch.yaml ]] || dsorch init --cluster dgx16
set -x
dsorch plan "$ROOT/examples/llama3-70b.yaml"
dsorch submit --cluster dgx16 --dry-run | head -n 20

dsorch plan "$ROOT/examples/tiny.yaml" --cluster local
dsorch submit --cluster local --data "$ROOT/examples/data/pydoc" --wait
dsorch status
set +x
job="$(dsorch status --json | python -c 'import json,sys; print(json.load(sys.stdin)[-1]["job_id"])')"
dsorch logs "$job" | grep -E '^step +(1|10|20|30) ' || true
