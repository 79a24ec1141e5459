"""Upgrading dsorch under queued jobs and committed plans: submitit pickles each job with its class
path, and a job queued by 0.1 (flat layout: ``orchestrator.slurm.TrainingJob``) is unpickled on the
nodes by the dsorch installed when it starts; a plan directory an older dsorch wrote is checked and
re-planned from what its plan.yaml recorded."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest

from orchestrator import MOVED_MODULES
from orchestrator.run.jobs import DoctorJob, TrainingJob


def _as_pickled_by_01(obj, old: str, new: str) -> bytes:
    # Protocol 0 writes the module path as a text line, so the 0.1 path can be put back in place
    # of today's: exactly the bytes 0.1 wrote for the same object.
    data = pickle.dumps(obj, protocol=0)
    assert new.encode() + b"\n" in data
    return data.replace(new.encode() + b"\n", old.encode() + b"\n")


@pytest.mark.parametrize("obj, old", [
    (TrainingJob("plans/x", "runs/1", steps=5), "orchestrator.slurm"),
    (DoctorJob("out", 1024, 3, False), "orchestrator.doctor"),
])
def test_a_job_pickled_under_the_old_class_path_unpickles_as_todays_class(obj, old, monkeypatch):
    data = _as_pickled_by_01(obj, old, type(obj).__module__)
    # As a node starting the job would: the old name not imported beforehand.
    monkeypatch.delitem(sys.modules, old, raising=False)
    job = pickle.loads(data)
    assert type(job) is type(obj) and job == obj
    assert type(job).__module__ == MOVED_MODULES[old]


def test_an_alias_is_the_module_itself_and_keeps_its_own_spec():
    import importlib

    alias = importlib.import_module("orchestrator.slurm")
    assert alias is sys.modules["orchestrator.run.jobs"]
    assert alias.__spec__.name == "orchestrator.run.jobs"


def test_an_unknown_old_name_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        __import__("orchestrator.no_such_module")


# ---- plan directories written before plan.yaml recorded whether --nodes was given -----------------


def _as_written_before_nodes_given(plan_dir) -> str:
    """plan.yaml as a dsorch that did not record inputs.nodes_given wrote it (the line alone was added)."""
    path = plan_dir / "plan.yaml"
    text = path.read_text()
    old = "\n".join(line for line in text.splitlines() if not line.startswith("  nodes_given: ")) + "\n"
    assert old != text
    path.write_text(old)
    return text


@pytest.mark.parametrize("resize, given", [([], "false"), (["--nodes", "2"], "true")])
def test_a_plan_directory_without_nodes_given_is_replanned_for_the_nodes_it_was_planned_for(
    runner, in_tmp, monkeypatch, resize, given
):
    """--check of an old plan directory: the node count it records is kept when it is not the profile's
    (it came from --nodes), followed when it is; the one difference is the line plan.yaml now adds, and
    `dsorch plan PLAN_DIR` writes it."""
    from .test_report import run

    # The local profile's hardware as a SLURM cluster's: the local executor plans one node only.
    (in_tmp / "profiles").mkdir()
    (in_tmp / "profiles" / "cpus.yaml").write_text("extends: local\nexecutor: slurm\n")
    monkeypatch.setenv("DSORCH_PROFILES_DIR", str(in_tmp / "profiles"))
    assert run(runner, "plan", "examples/tiny.yaml", "--cluster", "cpus", *resize, "--out", "p").exit_code == 0
    new = _as_written_before_nodes_given(in_tmp / "p")
    r = run(runner, "plan", "--check", "p")
    assert r.exit_code == 1, r.output
    changed = [line for line in r.stdout.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert changed == [f"+  nodes_given: {given}"]
    assert run(runner, "plan", "p").exit_code == 0
    assert (in_tmp / "p" / "plan.yaml").read_text() == new


def test_given_nodes_of_a_record_with_and_without_nodes_given():
    from orchestrator.compose import Recorded
    from orchestrator.plan.layout import Pins

    def record(nodes: int, given: bool | None) -> Recorded:
        return Recorded(spec=Path("s.yaml"), spec_path="s.yaml", cluster="c", runtime="deepspeed", nodes=nodes,
                        nodes_given=given, gpus_per_node=None, pins=Pins(), memory_margin_gib=None, keep=8)

    assert record(4, True).given_nodes(2) == 4 and record(2, True).given_nodes(2) == 2
    assert record(4, False).given_nodes(2) is None  # not given: the profile's count, whatever it is now
    # Not recorded: a count other than the profile's came from --nodes; the profile's own gives the same plan.
    assert record(4, None).given_nodes(2) == 4 and record(2, None).given_nodes(2) is None
