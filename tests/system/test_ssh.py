"""`dsorch submit/status/logs/cancel` from a "laptop" over SSH (orchestrator/run/remote.py): a
real OpenSSH server (Debian's openssh-server, started here on 127.0.0.1 with a throwaway host key
and user key) in front of the loopback SLURM cluster of test_slurm.py.

The laptop side is a directory of its own with its own registry and a profile that extends
`loopback` with a login section; its environment has no SLURM_CONF, so only the login node (the
sshd's sessions, which get SLURM_CONF from the sshd's SetEnv) can reach SLURM.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.run.remote import Remote
from orchestrator.spec.cluster import load_profile

from ..conftest import EXAMPLES, ROOT
from .test_slurm import DSORCH, PROFILES, dsorch, slurm_env, status, submitted_id, wait_for  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slurm

SSHD = "/usr/sbin/sshd"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """sshd -D on a free loopback port: a throwaway host key, one authorized throwaway user key, the
    sessions' environment set for the loopback cluster. Yields (port, user key, known_hosts)."""
    if not Path(SSHD).exists():
        pytest.skip(f"{SSHD} is not installed (scripts/slurm-test-cluster.sh start installs openssh-server)")
    d = tmp_path_factory.mktemp("sshd")
    _keygen(d / "host_key")
    _keygen(d / "user_key")
    shutil.copy(d / "user_key.pub", d / "authorized_keys")
    port = _free_port()
    conf = (
        subprocess.run(
            ["bash", str(ROOT / "scripts" / "slurm-test-cluster.sh"), "env"], capture_output=True, text=True, check=True
        )
        .stdout.strip()
        .split("=", 1)[1]
        .strip("'\"")
    )
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nPidFile {d}/sshd.pid\n"
        f"AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n"
        f"KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
        f"SetEnv SLURM_CONF={conf} DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 PYTHONPATH={ROOT}\n"
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stderr=open(d / "sshd.log", "w"))
    deadline = time.monotonic() + 20
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert proc.poll() is None and time.monotonic() < deadline, (d / "sshd.log").read_text()
        time.sleep(0.2)
    host_key = (d / "host_key.pub").read_text().split()[:2]
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {' '.join(host_key)}\n")
    yield port, d / "user_key", d / "known_hosts"
    proc.terminate()
    proc.wait(timeout=30)


def _laptop(tmp_path: Path, env: dict, port: int, key: Path, known_hosts: Path) -> tuple[Path, dict]:
    """The laptop's experiment directory and environment: its own profiles (loopback, and
    loopback-ssh with the login section), no SLURM_CONF."""
    laptop = tmp_path / "laptop"
    profiles = laptop / "profiles"
    profiles.mkdir(parents=True)
    shutil.copy(PROFILES / "loopback.yaml", profiles)
    (profiles / "loopback-ssh.yaml").write_text(
        f"name: loopback-ssh\nextends: loopback\nlogin:\n  host: root@127.0.0.1\n  port: {port}\n"
        f"  identity_file: {key}\n  known_hosts: {known_hosts}\n  remote_dir: {tmp_path / 'login-node'}\n"
        f"  dsorch: {DSORCH}\n"  # this checkout's code through the sshd's PYTHONPATH
    )
    laptop_env = {k: v for k, v in env.items() if k != "SLURM_CONF"}
    return laptop, dict(laptop_env, DSORCH_PROFILES_DIR=str(profiles), PYTHONPATH=str(ROOT))


TWO_RANKS = ["--nodes", "1", "--tp", "2", "--pp", "1", "--mbs", "4", "--zero", "1", "--no-sp", "--recompute", "none"]


def _close_connection(laptop: Path) -> None:
    """End the shared connection now: its session would outlive the sshd's listener by ControlPersist."""
    login = load_profile("loopback-ssh", laptop / "profiles").profile.login
    Remote("loopback-ssh", login).close()


def test_submit_status_logs_cancel_from_the_laptop(slurm_env, sshd, tmp_path, request):
    laptop, env = _laptop(tmp_path, slurm_env, *sshd)
    request.addfinalizer(lambda: _close_connection(laptop))
    dsorch(env, laptop, "plan", EXAMPLES / "tiny.yaml", "--cluster", "loopback-ssh", "--out", "plans/t", *TWO_RANKS)
    job = submitted_id(dsorch(env, laptop, "submit", "plans/t", "--steps", "4"))
    # A second job of the same plan (--force: both registries refuse it otherwise), on the other
    # node at the same time, to cancel.
    second = submitted_id(dsorch(env, laptop, "submit", "plans/t", "--steps", "100000", "--extend-schedule", "--force"))
    rec = wait_for(env, laptop, second, lambda r: r["state"] == "RUNNING", timeout=120, what="RUNNING")
    assert rec["executor"] == "remote"
    assert f"cancelled job {second}" in dsorch(env, laptop, "cancel", second).stdout
    assert next(r for r in status(env, laptop) if r["job_id"] == second)["state"] == "CANCELLED"
    deadline = time.monotonic() + 60
    while (sacct := _sacct(slurm_env, second)) != "CANCELLED":
        assert time.monotonic() < deadline, sacct
        time.sleep(2)

    rec = wait_for(env, laptop, job, lambda r: r["state"] == "COMPLETED", timeout=180, what="COMPLETED")
    assert rec["last_step"] == 4 and _sacct(slurm_env, job) == "COMPLETED"
    # The run's metrics came back into the laptop's own run directory; its checkpoints stayed there.
    run_dir = Path(rec["run_dir"])
    assert run_dir.is_relative_to(laptop) and not (run_dir / "checkpoints").exists()
    steps = [line for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"kind"' not in line]
    assert len(steps) == 4
    assert "COMPLETED" in dsorch(env, laptop, "status").stdout
    out = dsorch(env, laptop, "logs", job, "--rank", "1").stdout
    assert "_log.out <==" in out and len(out.splitlines()) > 2
    assert list((laptop / ".dsorch" / "jobs").rglob(f"{job}_1_log.out"))  # the logs came back too


def _sacct(env, job: str) -> str:
    out = subprocess.run(["sacct", "-n", "-X", "-j", job, "-o", "State"], env=env, capture_output=True, text=True)
    return out.stdout.split()[0].rstrip("+") if out.stdout.split() else "UNKNOWN"


def test_an_unknown_host_key_is_one_paragraph(sshd, tmp_path):
    port, key, _ = sshd
    laptop, env = _laptop(tmp_path, dict(os.environ), port, key, tmp_path / "empty_known_hosts")
    (tmp_path / "empty_known_hosts").write_text("")
    dsorch(env, laptop, "plan", EXAMPLES / "tiny.yaml", "--cluster", "loopback-ssh", "--out", "plans/t", *TWO_RANKS)
    r = dsorch(env, laptop, "submit", "plans/t", check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "is not a known host" in r.stderr and "login.known_hosts" in r.stderr and "ssh-keyscan" in r.stderr
