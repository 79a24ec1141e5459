#!/usr/bin/env bash
# The documentation site (mkdocs.yml, docs/), with the `docs` extra installed (scripts/setup.sh does):
#   bash scripts/docs.sh build   # mkdocs build --strict into site/: any warning fails, as in .ci/run
#   bash scripts/docs.sh serve   # http://127.0.0.1:8000, rebuilt on every save
#   bash scripts/docs.sh gen     # regenerate docs/reference/ and docs/generated/ from the code
# The build needs no network: the Material theme ships its assets and the config loads no web fonts.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=python
[[ -x .venv/bin/python ]] && PY=.venv/bin/python
export NO_MKDOCS_2_WARNING=1 DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
case "${1:-build}" in
  build) exec "$PY" -m mkdocs build --strict --site-dir site "${@:2}" ;;
  serve) exec "$PY" -m mkdocs serve --strict "${@:2}" ;;
  gen) exec "$PY" scripts/gen_docs.py "${@:2}" ;;
  *) echo "usage: bash scripts/docs.sh build|serve|gen" >&2; exit 2 ;;
esac
