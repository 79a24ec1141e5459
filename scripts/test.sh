#!/usr/bin/env bash
# The test command of the README and of CI: set up .venv, then run the whole suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -k cli -x).
#
# Two pytest processes side by side: the tests marked `jobs` (every SLURM test, and the local jobs
# paced by the entrypoint's test hook) spend most of their time waiting, on SLURM's clock, a time
# limit, or a paced step, so they run beside the CPU-bound rest instead of after it. Each process
# prints its own summary and slowest tests; the jobs' output comes second. DSORCH_TEST_SERIAL=1, or
# a `-m` of your own, runs one process.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
export DS_ACCELERATOR=cpu OMP_NUM_THREADS=1
# The slowest tests, printed at the end: the suite is meant to stay well under 30 minutes.
PYTEST=(.venv/bin/python -m pytest -q --durations=25)
serial="${DSORCH_TEST_SERIAL:-}"
for arg in "$@"; do
  if [[ "$arg" == -m* ]]; then serial=1; fi
done
if [[ "$serial" == 1 ]]; then
  exec "${PYTEST[@]}" "$@"
fi

jobs_log="$(mktemp -t dsorch-test-jobs.XXXXXX)"
trap 'rm -f "$jobs_log"' EXIT
# The cache plugin off in one of them: two processes would write .pytest_cache at once.
"${PYTEST[@]}" -p no:cacheprovider -m jobs "$@" >"$jobs_log" 2>&1 &
jobs_pid=$!
set +e
"${PYTEST[@]}" -m "not jobs" "$@"
rest_rc=$?
echo
echo "=== the tests marked jobs (run alongside) ==="
wait "$jobs_pid"
jobs_rc=$?
set -e
cat "$jobs_log"
# pytest's 5 is "no tests collected": a -k that selects from one group only is not a failure.
(( rest_rc == 5 && jobs_rc != 5 )) && rest_rc=0
(( jobs_rc == 5 && rest_rc != 5 )) && jobs_rc=0
exit $(( rest_rc > jobs_rc ? rest_rc : jobs_rc ))
