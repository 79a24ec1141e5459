#!/usr/bin/env bash
# The static checks of orchestrator/ (CI runs them before the tests): ruff's formatter and
# linter, then mypy. `scripts/lint.sh --fix` formats and applies ruff's safe fixes instead of
# only checking.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh >/dev/null
VPY=.venv/bin/python
if [[ "${1:-}" == "--fix" ]]; then
  "$VPY" -m ruff format orchestrator
  "$VPY" -m ruff check --fix orchestrator
else
  "$VPY" -m ruff format --check orchestrator
  "$VPY" -m ruff check orchestrator
fi
"$VPY" -m mypy
echo "lint: ruff and mypy clean on orchestrator/"
