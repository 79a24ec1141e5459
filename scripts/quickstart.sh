#!/usr/bin/env bash
# The README's main job: set up .venv, then plan Llama-3 70B on 16 DGX H100 nodes and the tiny
# model on this machine, writing both plan directories under plans/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
source .venv/bin/activate
export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
dsorch plan examples/llama3-70b.yaml --cluster dgx16 --out plans/llama70b-dgx16
dsorch plan examples/tiny.yaml --cluster local --out plans/tiny-local
dsorch validate plans/llama70b-dgx16
