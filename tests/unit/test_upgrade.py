"""Upgrading dsorch under queued jobs: submitit pickles each job with its class path, and a job
queued by 0.1 (flat layout: ``orchestrator.slurm.TrainingJob``) is unpickled on the nodes by the
dsorch installed when it starts."""

from __future__ import annotations

import pickle
import sys

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
