"""The scheduler backends (orchestrator/run/backends/): each registered one implements the whole
interface, the executor vocabulary has one home that the profile, plan.yaml, JobSpec, the
registry and the backends share, and no code outside the backends tests an executor's name."""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path

import pytest

from orchestrator.errors import JobError
from orchestrator.plandir.reader import PlanCluster
from orchestrator.run import remote
from orchestrator.run.backends import BACKENDS, Backend, JobSpec, backend_for
from orchestrator.run.backends.local import LocalBackend
from orchestrator.run.backends.remote import RemoteBackend
from orchestrator.run.backends.slurm import SlurmBackend
from orchestrator.run.registry import JobRecord, Registry
from orchestrator.spec.cluster import EXECUTORS, ClusterProfile, Executor, ProfileExecutor, load_profile

from ..conftest import ROOT

# The interface: every abstract method of Backend, and the facts callers ask instead of a name.
PROTOCOL = sorted(Backend.__abstractmethods__)
FACTS = ("executor", "queues", "has_script", "runs_here", "relays")


def test_the_protocol_is_what_the_issue_names():
    assert PROTOCOL == sorted(
        ["check", "script", "submit", "submit_array", "state", "cancel", "log_paths", "rank_setup"]
    )


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_registered_backend_implements_the_whole_protocol(name):
    cls = BACKENDS[name]
    assert cls.executor == name and not inspect.isabstract(cls), cls.__abstractmethods__
    for fact in FACTS:
        assert hasattr(cls, fact), f"{cls.__name__} lacks the fact {fact}"
    for method in PROTOCOL:
        ours = inspect.signature(getattr(Backend, method)).parameters
        theirs = inspect.signature(getattr(cls, method)).parameters
        assert list(theirs) == list(ours), f"{cls.__name__}.{method}{tuple(theirs)} is not Backend's {tuple(ours)}"


def test_the_registry_the_profile_and_plan_yaml_share_one_vocabulary():
    assert tuple(BACKENDS) == EXECUTORS == typing.get_args(Executor)
    named = typing.get_args(ProfileExecutor)
    assert set(named) < set(EXECUTORS)  # remote is not named: a login section leads there
    assert ClusterProfile.model_fields["executor"].annotation == ProfileExecutor
    assert PlanCluster.model_fields["executor"].annotation == ProfileExecutor
    hints = typing.get_type_hints(JobRecord)
    assert hints["executor"] == Executor
    assert typing.get_type_hints(JobSpec)["executor"] == Executor


def test_an_unknown_executor_is_a_clear_error(tmp_path):
    with pytest.raises(JobError, match=r"executor 'pbs' is not one dsorch knows \(slurm, local, remote\)"):
        backend_for("pbs")
    # A registry row that names one: `dsorch status` says so on the row rather than failing.
    from orchestrator.run.submission import refresh

    reg = Registry(tmp_path)
    with reg.reserve("plans/a", force=False) as (insert, _):
        key = insert(job_id="7", executor="pbs", cluster="c", plan_dir="plans/a", plan_sha256="x",
                     submitted_at="2026-01-01T00:00:00+00:00", state="RUNNING", run_dir="runs/r", log_dir="logs")
    with pytest.raises(JobError, match="job 7's registry row is damaged"):
        backend_for(reg.get(str(key)))
    rec = refresh(reg, reg.get(str(key)))
    assert rec.state == "UNKNOWN" and "'pbs' is not one dsorch knows" in rec.error


def test_a_job_spec_names_its_executor_and_a_login_section_makes_it_remote(tmp_path, monkeypatch):
    monkeypatch.delenv(remote.ON_LOGIN_NODE, raising=False)
    assert isinstance(backend_for(JobSpec.of(load_profile("local").profile, "t")), LocalBackend)
    assert isinstance(backend_for(JobSpec.of(load_profile("dgx16").profile, "t")), SlurmBackend)
    (tmp_path / "far.yaml").write_text("name: far\nextends: dgx16\nlogin:\n  host: me@login\n  remote_dir: exp\n")
    far = load_profile("far", tmp_path).profile
    spec = JobSpec.of(far, "t")
    backend = backend_for(spec)
    assert spec.executor == "remote" and isinstance(backend, RemoteBackend) and backend.relays
    assert backend.via.login.host == "me@login"
    monkeypatch.setenv(remote.ON_LOGIN_NODE, "1")  # on the login node its own SLURM submits
    assert JobSpec.of(far, "t").executor == "slurm"


def test_the_facts_callers_ask():
    # A SLURM job waits in the queue; a local one runs at once (the registry's first state).
    assert (SlurmBackend.queues, LocalBackend.queues, RemoteBackend.queues) == (True, False, True)
    assert (SlurmBackend.runs_here, LocalBackend.runs_here, RemoteBackend.runs_here) == (False, True, False)
    assert [b.executor for b in BACKENDS.values() if b.relays] == ["remote"]


def test_a_local_dry_run_says_what_would_start():
    spec = JobSpec.of(load_profile("local").profile, "t")
    text = backend_for(spec).script(spec, Path("/tmp/f"), None)  # type: ignore[arg-type]
    assert text == f"# --cluster local: {spec.tasks_per_node} processes on this machine through submitit's " \
                   f"LocalExecutor (no sbatch script).\n"


def test_the_remote_backend_refuses_what_it_cannot_do():
    with pytest.raises(JobError, match="needs the login section it goes through"):
        RemoteBackend.at(None)
    from orchestrator.spec.cluster import LoginSpec

    backend = RemoteBackend(remote.Remote("far", LoginSpec(host="me@login", remote_dir="exp")))
    spec = JobSpec.of(load_profile("dgx16").profile, "t")
    with pytest.raises(JobError, match=r"job arrays \(`dsorch trial`\) do not run over SSH yet"):
        backend.submit_array(spec, Path("/tmp/f"), [], 60)
    with pytest.raises(JobError, match="only a plan directory's job"):
        backend.submit(spec, Path("/tmp/f"), None)  # type: ignore[arg-type]


def test_no_code_outside_the_backends_tests_an_executor_by_name():
    """run/ and cli/ ask a backend object; the names appear where the vocabulary is parsed
    (spec/cluster.py, run/scheduler.py JobSpec.of) and in the backends themselves."""
    test = re.compile(r"""executor\s*[!=]=|[!=]=\s*["'](slurm|local|remote)["']|in \(["'](slurm|local|remote)""")
    found = []
    for folder in ("run", "cli"):
        for path in sorted((ROOT / "orchestrator" / folder).rglob("*.py")):
            if "backends" in path.parts:
                continue
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if test.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert found == []
