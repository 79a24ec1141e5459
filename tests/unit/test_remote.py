"""The profile's login section and what orchestrator/run/remote.py says before and around ssh (the
round trip through a real sshd and SLURM is tests/system/test_ssh.py)."""

from __future__ import annotations

import io
import shutil
import socket
import sqlite3
import subprocess
import tarfile

import pytest

from orchestrator.errors import JobError, SpecError
from orchestrator.run import remote
from orchestrator.run.remote import Remote, git_snapshot, not_over_ssh_yet
from orchestrator.spec.cluster import LoginSpec, load_profile


def _profile(tmp_path, login: str):
    (tmp_path / "mine.yaml").write_text(f"name: mine\nextends: local\nlogin:\n{login}")
    return load_profile("mine", tmp_path)


def test_a_profile_reads_its_login_section_and_keeps_it_out_of_dumps(tmp_path):
    p = _profile(tmp_path, "  host: me@login.example.org\n  port: 2222\n  remote_dir: exp\n").profile
    assert (p.login.host, p.login.port, p.login.remote_dir, p.login.dsorch) == ("me@login.example.org", 2222, "exp", "dsorch")
    assert "login" not in p.model_dump()  # plan.yaml's profile: a plan is the same from either side


@pytest.mark.parametrize(
    "login, key",
    [
        ("  host: -oProxyCommand=touch@x\n  remote_dir: d\n", "login.host"),
        ("  host: me@h;reboot\n  remote_dir: d\n", "login.host"),
        ('  host: me@h\n  remote_dir: "d\\nrm -rf x"\n', "login.remote_dir"),
        ('  host: me@h\n  remote_dir: d\n  dsorch: "dsorch\\r"\n', "login.dsorch"),
        ("  host: me@h\n", "remote_dir"),
    ],
)
def test_login_values_that_could_inject_are_refused_naming_the_key(tmp_path, login, key):
    with pytest.raises(SpecError, match=key.replace(".", r"\.")):
        _profile(tmp_path, login)


def _remote(tmp_path, **kw) -> Remote:
    values = dict(host="me@127.0.0.1", remote_dir="exp", known_hosts=str(tmp_path / "known_hosts"), **kw)
    return Remote("mine", LoginSpec(**values))


def test_a_missing_key_file_is_one_paragraph_naming_the_key(tmp_path):
    with pytest.raises(JobError) as e:
        _remote(tmp_path, identity_file=str(tmp_path / "nope")).shell("true")
    text = str(e.value)
    assert "login.identity_file" in text and str(tmp_path / "nope") in text and "ssh-keygen" in text
    assert "\n" not in text


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's client")
def test_a_refused_connection_is_one_paragraph_naming_host_and_port(tmp_path):
    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(JobError) as e:
            _remote(tmp_path, port=port).shell("true")
    text = str(e.value)
    assert "cannot reach me@127.0.0.1 port" in text and "login.host and login.port" in text
    assert "Connection refused" in text and "\n" not in text


def test_ssh_keeps_host_key_checking_and_never_asks_for_a_password(tmp_path):
    argv = _remote(tmp_path).ssh_command()
    assert "StrictHostKeyChecking=yes" in argv and "BatchMode=yes" in argv and "ControlMaster=auto" in argv
    other = _remote(tmp_path, identity_file="/k").ssh_command()
    # Another key or known_hosts file never rides on a connection the first one opened.
    control = [a for a in argv if a.startswith("ControlPath=")]
    assert control and control != [a for a in other if a.startswith("ControlPath=")]


def test_trial_and_doctor_say_they_are_not_over_ssh_yet(tmp_path, monkeypatch):
    login = LoginSpec(host="me@h", remote_dir="d")
    with pytest.raises(JobError, match="`dsorch trial` does not run over SSH yet"):
        not_over_ssh_yet("mine", login, "trial")
    monkeypatch.setenv(remote.ON_LOGIN_NODE, "1")  # on the login node the section is ignored
    not_over_ssh_yet("mine", login, "trial")
    not_over_ssh_yet("mine", None, "doctor")


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_code_snapshot_is_git_archive_of_head_from_the_experiment_directory(tmp_path):
    assert git_snapshot(tmp_path) is None  # not a repository: the plan directory alone goes
    exp = tmp_path / "repo" / "exp"
    exp.mkdir(parents=True)
    (exp / "dsorch.yaml").write_text("cluster: mine\n")
    (exp / "uncommitted.txt").write_text("x")
    (tmp_path / "repo" / "outside.txt").write_text("y")

    def git(*a):
        subprocess.run(["git", "-C", str(tmp_path / "repo"), *a], check=True, capture_output=True)

    git("init", "-q")
    git("add", "exp/dsorch.yaml", "outside.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    names = tarfile.open(fileobj=io.BytesIO(git_snapshot(exp))).getnames()
    assert names == ["dsorch.yaml"]  # HEAD, paths from the experiment directory, nothing above it


def test_submit_options_that_name_local_files_are_refused_over_ssh():
    from orchestrator.run.submission import remote_args

    assert remote_args("mine", {"--data": None}, 4, True, 0) == ["--steps", "4", "--extend-schedule"]
    with pytest.raises(JobError, match="--data, --resume: not over SSH yet"):
        remote_args("mine", {"--data": "corpus", "--resume": True, "--run-dir": None}, None, False, 0)


def test_a_schema_2_registry_gains_the_login_column(tmp_path):
    from orchestrator.run.registry import SCHEMA_VERSION, Registry

    reg = Registry(tmp_path)
    reg.dir.mkdir()
    con = sqlite3.connect(reg.path)
    con.executescript("""
        CREATE TABLE jobs (key INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, executor TEXT NOT NULL,
            cluster TEXT NOT NULL, plan_dir TEXT NOT NULL, plan_sha256 TEXT NOT NULL, submitted_at TEXT NOT NULL,
            state TEXT NOT NULL, run_dir TEXT NOT NULL, log_dir TEXT NOT NULL, requeues INTEGER NOT NULL DEFAULT 0,
            last_step INTEGER, last_loss REAL, elapsed_s REAL, error TEXT, updated_at TEXT NOT NULL, data TEXT);
        INSERT INTO jobs (job_id, executor, cluster, plan_dir, plan_sha256, submitted_at, state, run_dir, log_dir,
            updated_at, data) VALUES ('9', 'slurm', 'c', 'plans/a', 'x', 't', 'COMPLETED', 'runs/r', 'logs', 't', '/d');
        PRAGMA user_version = 2;
    """)
    con.close()
    assert [(r.job_id, r.data, r.login) for r in reg.all()] == [("9", "/d", None)]
    assert sqlite3.connect(reg.path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3


def test_a_submission_over_ssh_goes_through_the_remote_backend_and_keeps_one_row(runner, in_tmp, monkeypatch):
    """A login section makes the job's executor remote: the plan is shipped, the login node's `dsorch
    submit` takes the options, and the local registry keeps the row with the login section. FAKES:
    Remote.ship and Remote.submit stand in for ssh (the round trip is tests/system/test_ssh.py)."""
    import json

    from orchestrator.cli.main import main
    from orchestrator.run.registry import Registry

    monkeypatch.delenv(remote.ON_LOGIN_NODE, raising=False)
    (in_tmp / "profiles").mkdir()
    (in_tmp / "profiles" / "far.yaml").write_text(
        "name: far\nextends: local\nlogin:\n  host: me@login\n  remote_dir: exp\n"
    )
    r = runner.invoke(main, ["plan", "examples/tiny.yaml", "--cluster", "far", "--profiles-dir", "profiles",
                             "--out", "plans/t"])
    assert r.exit_code == 0, r.output
    calls = []
    monkeypatch.setattr(Remote, "ship", lambda self, *a: calls.append(("ship", a[2], a[3])))
    monkeypatch.setattr(Remote, "submit", lambda self, args: calls.append(("submit", args)) or "4242")
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")  # ssh "installed"
    r = runner.invoke(main, ["submit", "plans/t", "--profiles-dir", "profiles", "--steps", "3", "--force"])
    assert r.exit_code == 0, r.output
    assert "submitted job 4242 (remote, cluster far)" in r.output
    (rec,) = Registry(in_tmp).all()
    assert (rec.executor, rec.state, json.loads(rec.login)["host"]) == ("remote", "PENDING", "me@login")
    assert calls == [("ship", "plans/t", "profiles"),
                     ("submit", ["plans/t", "--profiles-dir", remote.REMOTE_PROFILES, "--steps", "3", "--force"])]
    r = runner.invoke(main, ["submit", "plans/t", "--profiles-dir", "profiles", "--resume"])
    assert r.exit_code == 2 and "--resume: not over SSH yet" in r.output and len(Registry(in_tmp).all()) == 1
