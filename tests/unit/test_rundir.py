"""RunDir: the run directory's file names, spelt once (orchestrator/plandir/rundir.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.plandir.rundir import RunDir

ROOT = Path(__file__).resolve().parents[2]


def test_default_is_beside_plan_yaml(tmp_path):
    assert RunDir.default(tmp_path).path == tmp_path / "run"
    assert RunDir.for_plan(tmp_path) == RunDir.default(tmp_path)
    assert RunDir.for_plan(tmp_path, "") == RunDir.default(tmp_path)  # argparse's empty $DSORCH_RUN_DIR
    assert RunDir.for_plan(tmp_path, "elsewhere").path == Path("elsewhere")


def test_paths_inside_the_run_directory(tmp_path):
    run = RunDir(tmp_path)
    assert run.checkpoints == tmp_path / "checkpoints"
    # job.sbatch spells these too (templates/job.sbatch.j2): they are one protocol with the entrypoint.
    assert run.stop_request == tmp_path / "stop.request"
    assert run.stopped == tmp_path / "stopped.json"
    # A container's batch script (run/backends/slurm.py _container_parameters) requeues on this one.
    assert run.requeue_request == tmp_path / "requeue.request"
    assert {run.metrics.parent, run.starts.parent} == {tmp_path}
    assert not run.has_metrics()
    run.metrics.write_text("{}\n")
    assert run.has_metrics()
    assert Path(run) == tmp_path and str(run) == str(tmp_path)  # os.PathLike


def test_job_sbatch_names_the_same_files():
    """The batch script is a template, not Python: it names the stop files itself; they must agree."""
    text = (ROOT / "templates" / "job.sbatch.j2").read_text()
    run = RunDir(Path("R"))
    for path in (run.stop_request, run.stopped, run.checkpoints):
        assert f'"$DSORCH_RUN_DIR/{path.name}' in text or f'"$DSORCH_RUN_DIR"/{path.name}' in text, path.name


@pytest.mark.parametrize("name", [RunDir(Path("R")).metrics.name, RunDir(Path("R")).requeue_request.name])
def test_the_file_is_named_in_one_module(name):
    """The step records' and the requeue request's file names are spelt in rundir.py only (issue 36):
    every other module asks RunDir."""
    spelt = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "orchestrator").rglob("*.py")
        if re.search(re.escape(name), p.read_text(encoding="utf-8"))
    )
    assert spelt == ["orchestrator/plandir/rundir.py"]
