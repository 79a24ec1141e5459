"""job.sbatch's own logic, run by bash with a FAKE srun (the job step needs a cluster): a time-limit
warning that reaches the script after the ranks' last step, while they are exiting, leaves no stop
request behind (it would stop the next run in the directory at its first step), and the job ends 0."""

from __future__ import annotations

import os
import subprocess
import textwrap

from click.testing import CliRunner

from orchestrator.cli.main import main

from ..conftest import EXAMPLES

# FAKE srun: the step trains to its end (nothing to run here), then SLURM's warning (--signal=B:USR2)
# reaches the batch script while the ranks exit; the step ends 0 a moment later.
LATE_WARNING_SRUN = """\
#!/bin/bash
# fake_srun (tests/system/test_job_script.py): the warning arrives after the last step
kill -USR2 "$PPID"
sleep 0.5
exit 0
"""


def test_a_warning_after_the_last_step_leaves_no_stop_request(tmp_path):
    plan = tmp_path / "plan"
    r = CliRunner().invoke(main, ["plan", str(EXAMPLES / "tiny.yaml"), "--cluster", "local", "--out", str(plan)])
    assert r.exit_code == 0, r.output
    fakebin = tmp_path / "fakebin"
    fakebin.mkdir()
    (fakebin / "srun").write_text(LATE_WARNING_SRUN)
    (fakebin / "srun").chmod(0o755)
    env = dict(os.environ, PATH=f"{fakebin}:{os.environ['PATH']}", SLURM_SUBMIT_DIR=str(plan), SLURM_JOB_ID="7",
               SLURM_JOB_NODELIST="node1")
    res = subprocess.run(["bash", str(plan / "job.sbatch")], cwd=plan, env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (plan / "run").is_dir() and not (plan / "run" / "stop.request").exists(), textwrap.shorten(res.stderr, 500)
