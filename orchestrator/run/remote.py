"""A laptop's way to the cluster: `dsorch submit/status/logs/cancel` run their SLURM side on the
login node that the profile's ``login`` section names (spec/cluster.py LoginSpec), over SSH.

OpenSSH's own ``ssh``, run as a subprocess, rather than asyncssh or paramiko: the user's
~/.ssh/config (Host aliases, User, ProxyJump through a bastion), ssh-agent and hardware keys,
certificates and GSSAPI/Kerberos logins (which many HPC centres require) work exactly as they do
for the user's own `ssh`, and dsorch gains no dependency. One connection per login node is reused
(ControlMaster=auto with ControlPersist; the socket lives in a directory only this user can
enter), so each further command costs a round trip rather than a handshake and a second factor.

Host keys are checked (StrictHostKeyChecking=yes: an unknown or changed key stops dsorch) and no
password is ever asked for or kept (BatchMode=yes): a key file or the agent, and the login node's
host key in known_hosts, are what let dsorch in.

What runs where:

- submit: a code snapshot of the experiment (``git archive`` of HEAD when the experiment directory
  is in a git repository), the plan directory and the profiles directory go to ``login.remote_dir``
  (tar over ssh); the login node's ``dsorch submit`` submits there and keeps the job in its own
  registry; the local registry keeps it as executor ``remote`` with the login section it went
  through (run/backends/remote.py, the backend this module is the transport of).
- status: the login node's ``dsorch status --json``; once the job has ended, its run directory
  (checkpoints left there) and its log files come back into the local run and log directories
  (rsync where both ends have it, else tar over ssh).
- logs, cancel: the login node's ``dsorch logs`` and ``dsorch cancel``.

The login node's dsorch runs with DSORCH_LOGIN_NODE=1 set, so that it ignores the login section:
it is already where the section leads.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import JobError
from orchestrator.spec.cluster import LoginSpec

# Set in the environment of the login node's dsorch: the login section is ignored there.
ON_LOGIN_NODE = "DSORCH_LOGIN_NODE"
# Where the profiles directory goes, under login.remote_dir; the remote submit reads it.
REMOTE_PROFILES = ".dsorch/login-profiles"
# The line `dsorch submit` prints for a job it submitted (cli/submit.py).
_SUBMITTED = re.compile(r"^submitted job (\S+) ", re.MULTILINE)
# How long the shared connection outlives its last command, seconds (ssh_config(5) ControlPersist).
_PERSIST_S = 120
# ssh's own exit status when it failed, rather than the remote command (ssh(1), EXIT STATUS).
_SSH_FAILED = 255


def login_of(login: LoginSpec | None) -> LoginSpec | None:
    """The profile's login section where it applies: not on the login node itself."""
    return None if os.environ.get(ON_LOGIN_NODE) == "1" else login


@dataclass(frozen=True)
class Remote:
    """The login node of profile ``cluster``, reached as its ``login`` section says."""

    cluster: str
    login: LoginSpec

    # ---------------------------------------------------------------------------------------
    # ssh itself
    # ---------------------------------------------------------------------------------------

    def ssh_command(self) -> list[str]:
        """``ssh`` and its options, without the destination."""
        opts = [
            "ssh",
            "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes",
            "-o", "ControlMaster=auto",
            "-o", f"ControlPath={_control_dir()}/{self._tag()}-%C",
            "-o", f"ControlPersist={_PERSIST_S}",
            "-o", "ConnectTimeout=30",
            "-p", str(self.login.port),
        ]  # fmt: skip
        if self.login.identity_file:
            opts += ["-i", _expand(self.login.identity_file), "-o", "IdentitiesOnly=yes"]
        if self.login.known_hosts:
            opts += ["-o", f'UserKnownHostsFile="{_expand(self.login.known_hosts)}"']
        return opts

    def shell(self, command: str, *, stdin: bytes | None = None, stream: bool = False) -> subprocess.CompletedProcess:
        """Run a shell command on the login node; ssh's own failures become one paragraph. With
        ``stream`` the remote stdout goes straight to ours (logs --follow)."""
        self._check_key()
        argv = [*self.ssh_command(), "--", self.login.host, command]
        try:
            r = subprocess.run(
                argv, input=stdin, stdout=None if stream else subprocess.PIPE, stderr=subprocess.PIPE, check=False
            )
        except FileNotFoundError:
            raise self.no_ssh() from None
        if r.returncode == _SSH_FAILED:
            raise self._failure(r.stderr.decode(errors="replace"))
        return r

    def dsorch(self, *args: str, stream: bool = False) -> subprocess.CompletedProcess:
        """The login node's dsorch in login.remote_dir; a failure of its own is a JobError with
        its message."""
        command = f"{self._cd()} && {ON_LOGIN_NODE}=1 {self.login.dsorch} {shlex.join(args)}"
        r = self.shell(command, stream=stream)
        if r.returncode != 0:
            said = r.stderr.decode(errors="replace").strip() or (r.stdout or b"").decode(errors="replace").strip()
            raise JobError(f"on {self.login.host} (profile {self.cluster}), `dsorch {' '.join(args)}` failed:\n{said}")
        return r

    def no_ssh(self) -> JobError:
        return JobError(
            f"profile {self.cluster} has a login section, which needs OpenSSH's `ssh`; it is not on PATH. "
            f"Install the OpenSSH client (openssh-client on Debian and Ubuntu)."
        )

    def close(self) -> None:
        """Stop the shared connection now rather than after ControlPersist."""
        subprocess.run([*self.ssh_command(), "-O", "exit", "--", self.login.host], capture_output=True, check=False)

    def _tag(self) -> str:
        """Part of the shared connection's name: ssh's %C (a hash of host, port and user) alone
        would let a profile with other keys or another known_hosts ride on a connection that
        another profile's checks opened."""
        return hashlib.sha256(self.login.model_dump_json().encode()).hexdigest()[:12]

    def _cd(self, sub: str = "") -> str:
        """``cd`` into login.remote_dir (or a directory below it), made if missing; a relative
        remote_dir starts at the home directory, where ssh starts."""
        d = self.login.remote_dir.removeprefix("~/")
        target = shlex.quote(f"{d}/{sub}" if sub else d)
        return f"mkdir -p -- {target} && cd -- {target}"

    def _check_key(self) -> None:
        key = self.login.identity_file
        if key and not Path(_expand(key)).is_file():
            raise JobError(
                f"profile {self.cluster}: login.identity_file {key} does not exist, so ssh cannot log in to "
                f"{self.login.host}. Point login.identity_file at your private key for the login node (the "
                f"file without .pub), make one with `ssh-keygen -t ed25519` and have its .pub added to "
                f"~/.ssh/authorized_keys there, or leave login.identity_file out to use ssh-agent and "
                f"~/.ssh/config. dsorch never asks for or keeps a password."
            )

    def _failure(self, stderr: str) -> JobError:
        """ssh's failure as one paragraph naming the profile key to fix."""
        host, port = self.login.host, self.login.port
        target = host.rpartition("@")[2]
        said = " ".join(line.strip() for line in stderr.strip().splitlines()[-2:])
        if "REMOTE HOST IDENTIFICATION HAS CHANGED" in stderr:
            return JobError(
                f"the host key of {target} port {port} (profile {self.cluster}, login.host) is not the one in "
                f"{self._known_hosts()}: the login node was reinstalled, or someone is in between. Ask the "
                f"cluster's admins for its key fingerprint; if it matches, remove the old key with "
                f"`ssh-keygen -R '[{target}]:{port}'` and add the new one. ({said})"
            )
        if "Host key verification failed" in stderr or "host key is known" in stderr:
            return JobError(
                f"{target} port {port} (profile {self.cluster}, login.host and login.port) is not a known host: "
                f"its host key is not in {self._known_hosts()}, and dsorch checks host keys. Compare the key's "
                f"fingerprint with what the cluster's admins publish, then add it: log in once with "
                f"`ssh -p {port} {host}` and accept it, or `ssh-keyscan -p {port} {target} >> FILE`, or set "
                f"login.known_hosts to a file that has it. ({said})"
            )
        if "Permission denied" in stderr:
            key = self.login.identity_file or "ssh's default keys and agent"
            return JobError(
                f"{host} port {port} (profile {self.cluster}) refused the key ({key}, login.identity_file). Add "
                f"the matching .pub to ~/.ssh/authorized_keys on the login node (`ssh-copy-id -p {port} -i KEY.pub "
                f"{host}`), point login.identity_file at a key it accepts, or load one into ssh-agent; dsorch "
                f"never asks for a password. ({said})"
            )
        return JobError(
            f"cannot reach {host} port {port} (profile {self.cluster}, login.host and login.port): "
            f"{said or 'ssh failed'}. "
            f"Check the host name and port, and that this machine is on the network (or VPN) that reaches "
            f"the login node; `ssh -p {port} {host}` shows the same."
        )

    def _known_hosts(self) -> str:
        return self.login.known_hosts or "~/.ssh/known_hosts"

    # ---------------------------------------------------------------------------------------
    # files both ways
    # ---------------------------------------------------------------------------------------

    def ship(self, experiment_dir: Path, plan_dir: Path, remote_plan: str, profiles_dir: str | None) -> None:
        """The experiment's code snapshot, then the plan directory (as ``remote_plan``) and the
        profiles directory, into login.remote_dir."""
        snapshot = git_snapshot(experiment_dir)
        if snapshot is not None:
            self._untar(snapshot)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(plan_dir, arcname=remote_plan)
            if profiles_dir:
                tar.add(profiles_dir, arcname=REMOTE_PROFILES)
        self._untar(buf.getvalue())

    def _untar(self, archive: bytes) -> None:
        r = self.shell(f"{self._cd()} && tar -xf -", stdin=archive)
        if r.returncode != 0:
            raise JobError(
                f"copying the plan to {self.login.host}:{self.login.remote_dir} (profile {self.cluster}, "
                f"login.remote_dir) failed: {r.stderr.decode(errors='replace').strip()}; check that the "
                f"directory can be written there."
            )

    def bring_back(self, remote: str, local: Path, only: str | None = None, exclude: str | None = None) -> None:
        """Copy the remote directory ``remote`` (its files named ``only``, a glob, or all but
        ``exclude``) into ``local``: rsync where both ends have it, else tar over ssh."""
        local.mkdir(parents=True, exist_ok=True)
        if shutil.which("rsync") and self._rsync(remote, local, only, exclude):
            return
        pick = f"-- {only}" if only else f"--exclude=./{exclude} -- ." if exclude else "-- ."
        command = f"cd -- {shlex.quote(remote)} && tar -cf - {pick}"
        self._check_key()
        with subprocess.Popen([*self.ssh_command(), "--", self.login.host, command], stdout=subprocess.PIPE) as ssh:
            untar = subprocess.run(["tar", "-C", str(local), "-xf", "-"], stdin=ssh.stdout, capture_output=True)
        if ssh.returncode != 0 or untar.returncode != 0:
            raise JobError(
                f"bringing {self.login.host}:{remote} back to {local} failed (tar exit {ssh.returncode}, "
                f"{untar.stderr.decode(errors='replace').strip()})."
            )

    def _rsync(self, remote: str, local: Path, only: str | None, exclude: str | None) -> bool:
        """rsync over the shared connection; False where it cannot (no rsync on the login node)."""
        filters = [f"--include={only}", "--exclude=*"] if only else [f"--exclude=/{exclude}"] if exclude else []
        r = subprocess.run(
            ["rsync", "-a", "--protect-args", *filters, "-e", shlex.join(self.ssh_command()),
             f"{self.login.host}:{remote.rstrip('/')}/", f"{local}/"],
            capture_output=True,
            check=False,
        )  # fmt: skip
        return r.returncode == 0

    # ---------------------------------------------------------------------------------------
    # jobs
    # ---------------------------------------------------------------------------------------

    def submit(self, args: list[str]) -> str:
        """The login node's ``dsorch submit ARGS``; the job id it printed."""
        out = self.dsorch("submit", *args).stdout.decode(errors="replace")
        found = _SUBMITTED.search(out)
        if found is None:
            raise JobError(f"the login node's dsorch submit printed no job id:\n{out.strip()}")
        return found.group(1)

    def job(self, job_id: str) -> dict:
        """The login node's registry row of ``job_id`` (`dsorch status --json` there, which asks sacct)."""
        rows = json.loads(self.dsorch("status", "--json").stdout)
        mine = [row for row in rows if row.get("job_id") == job_id]
        if not mine:
            raise JobError(
                f"job {job_id} is not in the registry of {self.login.host}:{self.login.remote_dir} (profile "
                f"{self.cluster}, login.remote_dir); was login.remote_dir changed since it was submitted?"
            )
        return mine[-1]


def _expand(path: str) -> str:
    return os.path.expanduser(path)


def _control_dir() -> Path:
    """A directory for the shared connection's socket that only this user can enter: a socket
    there lets whoever can open it run commands as the user on the login node."""
    d = Path(tempfile.gettempdir()) / f"dsorch-ssh-{os.getuid()}"
    try:
        d.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(d)
    except OSError as e:
        raise JobError(f"cannot make {d} for the SSH connection's socket ({e}); check {d.parent}.") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise JobError(
            f"{d} is not a directory private to this user (mode {stat.filemode(st.st_mode)}, owner {st.st_uid}); "
            f"remove it so that dsorch can make its own."
        )
    return d


def git_snapshot(directory: Path) -> bytes | None:
    """``git archive`` of HEAD for ``directory`` (a tar whose paths start there), None where it is
    not in a git repository with a commit."""
    if shutil.which("git") is None:
        return None
    where = subprocess.run(
        ["git", "-C", str(directory), "rev-parse", "--show-toplevel", "--show-prefix"],
        capture_output=True,
        text=True,
        check=False,
    )
    if where.returncode != 0:
        return None
    top, _, prefix = where.stdout.partition("\n")
    # From the top: git archive run in a subdirectory archives only what is below it, by path.
    r = subprocess.run(
        ["git", "-C", top, "archive", "--format=tar", f"HEAD:{prefix.strip()}"], capture_output=True, check=False
    )
    return r.stdout if r.returncode == 0 else None  # no commit yet: the plan directory alone


def not_over_ssh_yet(cluster: str, login: LoginSpec | None, command: str) -> None:
    """Refuse a command that does not run its SLURM side over the profile's login section yet."""
    if login_of(login) is not None:
        raise JobError(
            f"`dsorch {command}` does not run over SSH yet, and profile {cluster} has a login section "
            f"({login.host if login else ''}); run `dsorch {command}` on the login node itself, where "
            f"the login section is ignored (DSORCH_LOGIN_NODE=1) or absent."
        )
