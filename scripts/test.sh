#!/usr/bin/env bash
# The test command of the README and of CI: set up .venv, then run the whole suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -k cli -x).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
export DS_ACCELERATOR=cpu OMP_NUM_THREADS=1
# The slowest tests, printed at the end: the suite is meant to stay well under 30 minutes.
exec .venv/bin/python -m pytest -q --durations=25 "$@"
