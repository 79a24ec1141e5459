"""A profile with a `container` section on the loopback SLURM cluster: `dsorch submit` and plain
`sbatch job.sbatch` run the job step in the container, and a preemption in the middle (SIGUSR2)
checkpoints, requeues from the host and resumes, every step once.

The containers are FAKES (tests/fakes/): Apptainer cannot be installed here (Debian 12 has no
apptainer or singularity-container package) and Pyxis needs enroot and a SPANK-enabled srun. The
fake `apptainer` and the fake Pyxis `srun` record their argv beside the image, refuse a missing
image or mount source, honour the working directory and run the command on the host. The profile
puts them on PATH with its own slurm.setup line, as a site's module load would. SLURM itself,
DeepSpeed and the ranks are real.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..conftest import ROOT
from .test_slurm import (  # noqa: F401  (slurm_env is a fixture)
    ENDED,
    PROFILES,
    Sbatch,
    _allocations_and_requeues,
    _long_tiny_spec,
    _sacct_state,
    dsorch,
    losses,
    slurm_env,
    status,
    submitted_id,
)

pytestmark = pytest.mark.slurm

FAKES = Path(__file__).parents[1] / "fakes"
ONE_NODE = ["--nodes", "1", "--tp", "1", "--pp", "1", "--zero", "1", "--mbs", "4", "--recompute", "none", "--no-sp"]
# examples/tiny.yaml for this many steps: at the test hook's 0.3 s a step, the preemption after
# step 4 has 13 s to land before the end, on a machine busy with three more such jobs.
STEPS = 48


def container_profile(tmp_path: Path, runtime: str) -> dict:
    """A profiles directory with the loopback cluster and `boxed`, the same with a container; the
    environment the test's dsorch, sbatch and jobs run in."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "loopback.yaml").write_text((PROFILES / "loopback.yaml").read_text())
    images, data, work = tmp_path / "images", tmp_path / "data", tmp_path / "work"
    for d in (images, data, work):
        d.mkdir()
    image = images / ("train.sif" if runtime == "apptainer" else "train.sqsh")
    image.write_bytes(b"FAKE IMAGE")
    fake_dir = FAKES / runtime
    (profiles / "boxed.yaml").write_text(
        "name: boxed\nextends: loopback\nslurm:\n"
        f"  setup: [{json.dumps(f'export PATH={fake_dir}:$PATH')}]\n"
        f"container:\n  runtime: {runtime}\n  image: {image}\n  mounts: ['{data}:{data}:ro']\n"
        f"  workdir: {work}\n  env: [DSORCH_TEST_MIN_STEP_SECONDS]\n  mount_home: false\n  python: {sys.executable}\n"
    )
    return {"DSORCH_PROFILES_DIR": str(profiles), "image": str(image), "work": str(work)}


def job_env(slurm_env, box: dict) -> dict:
    # torchrun from this venv and this checkout's code in every process; each step paced so that
    # the preemption lands mid-run (the entrypoint's test hook).
    return dict(slurm_env, DSORCH_PROFILES_DIR=box["DSORCH_PROFILES_DIR"], PYTHONPATH=str(ROOT),
                PATH=f"{Path(sys.executable).parent}:{slurm_env['PATH']}", DSORCH_TEST_MIN_STEP_SECONDS="0.3")


def steps_done(run: Path) -> int:
    try:
        return len(losses(run))
    except (OSError, ValueError):  # not there yet, or a line half-written
        return 0


def recorded(box: dict) -> list[list[str]]:
    log = Path(box["image"]).parent / "container-argv.log"
    return [shlex.split(line) for line in log.read_text().splitlines()] if log.exists() else []


def check_recorded(box: dict, runtime: str, plan: Path, run: Path) -> None:
    calls = recorded(box)
    assert calls, "the container tool was never called"
    for argv in calls:
        if runtime == "pyxis":
            assert f"--container-image={box['image']}" in argv and f"--container-workdir={box['work']}" in argv
            assert "--no-container-mount-home" in argv and "--container-env=DSORCH_TEST_MIN_STEP_SECONDS" in argv
            mounts = next(a for a in argv if a.startswith("--container-mounts=")).split("=", 1)[1].split(",")
        else:
            assert argv[:2] == ["apptainer", "exec"] and "--nv" not in argv  # a CPU profile: no --nv
            assert box["image"] in argv and argv[argv.index("--pwd") + 1] == box["work"]
            mounts = argv[argv.index("--bind") + 1].split(",")
        assert f"{plan}:{plan}" in mounts and f"{run}:{run}" in mounts, mounts


@dataclass
class BoxedRun:
    """One tiny run in a container, by `dsorch submit` ("submit") or plain sbatch ("sbatch")."""

    how: str
    runtime: str
    exp: Path
    box: dict
    env: dict
    job: str = ""
    run: Path = Path()
    preempted_at: int | None = None  # the steps done when the preemption was sent
    state: str = "PENDING"

    @property
    def plan(self) -> Path:
        return (self.exp / "plans" / "p").resolve()

    def make_plan(self) -> None:
        dsorch(self.env, self.exp, "plan", _long_tiny_spec(self.exp, STEPS), "--cluster", "boxed", "--out", self.plan, *ONE_NODE)

    def start(self) -> None:
        if self.how == "submit":
            self.job = submitted_id(dsorch(self.env, self.exp, "submit", self.plan, "--save-interval", "10"))
            self.run = Path(next(r["run_dir"] for r in status(self.env, self.exp) if r["job_id"] == self.job))
        else:
            self.job, self.run = Sbatch(self.plan, self.env).submit().job, self.plan / "run"

    def preempt(self) -> None:
        """SLURM's warning before preemption or the time limit, 4 steps in. Under `dsorch submit` to
        every task (inside the container): each rank checkpoints, rank 0 leaves requeue.request, the
        batch script requeues on the host. To job.sbatch as --signal=B:USR2 sends it, to the batch
        script on the host: its trap touches the stop file, which rank 0 reads inside the container."""
        batch = ["--batch"] if self.how == "sbatch" else []
        self.preempted_at = steps_done(self.run)
        subprocess.run(["scancel", *batch, "--signal=USR2", self.job], env=self.env, check=True)

    def log(self) -> str:
        return Sbatch(self.plan, self.env, self.job).log()


CASES = [(how, runtime) for how in ("submit", "sbatch") for runtime in ("pyxis", "apptainer")]


@pytest.fixture(scope="module")
def preempted_runs(slurm_env, tmp_path_factory) -> dict[tuple[str, str], BoxedRun]:
    """The four cases at once, one node each (2 of its 4 CPUs) on the two loopback nodes: every run
    is preempted once 4 steps are done, and the module waits for all of them to end. Run one after
    another they took four times a job's start-up and preemption."""
    runs = {}
    for how, runtime in CASES:
        exp = tmp_path_factory.mktemp(f"{how}-{runtime}")
        box = container_profile(exp, runtime)
        runs[how, runtime] = BoxedRun(how, runtime, exp, box, job_env(slurm_env, box))
    for run in runs.values():
        run.make_plan()
    for run in runs.values():
        run.start()
    deadline = time.monotonic() + 600
    next_look = 0.0
    try:
        while time.monotonic() < deadline and any(r.state not in ENDED for r in runs.values()):
            # The steps often (reading a file), the states now and then (sacct is slower): a late
            # preemption would find the run done.
            for r in runs.values():
                if r.preempted_at is None and steps_done(r.run) >= 4:
                    r.preempt()
            if time.monotonic() >= next_look:
                for r in runs.values():
                    r.state = _sacct_state(r.env, r.job)
                next_look = time.monotonic() + 3
            time.sleep(0.2)
        yield runs
    finally:
        for r in runs.values():
            subprocess.run(["scancel", r.job], env=r.env, capture_output=True)  # nothing, unless one hung



@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_dsorch_submit_in_a_container_survives_a_preemption(preempted_runs, runtime):
    r = preempted_runs["submit", runtime]
    assert r.preempted_at is not None, f"job {r.job} ended {r.state} before it was 4 steps in"
    rec = next(x for x in status(r.env, r.exp) if x["job_id"] == r.job)
    assert rec["state"] == "COMPLETED", rec
    assert rec["requeues"] >= 1, f"preempted after step {r.preempted_at}, yet never requeued: {rec}"
    assert len((r.run / "starts.jsonl").read_text().splitlines()) >= 2
    assert [s for s, _ in losses(r.run)] == list(range(1, STEPS + 1))  # each step once, none lost
    assert not (r.run / "requeue.request").exists()
    check_recorded(r.box, runtime, r.plan, r.run)


@pytest.mark.parametrize("runtime", ["apptainer", "pyxis"])
def test_plain_sbatch_in_a_container_survives_a_preemption(preempted_runs, runtime):
    r = preempted_runs["sbatch", runtime]
    log = r.log()
    assert r.preempted_at is not None, f"job {r.job} ended {r.state} before it was 4 steps in:\n{log[-4000:]}"
    assert r.state == "COMPLETED", f"job {r.job} ended {r.state} (preempted after step {r.preempted_at}):\n{log[-4000:]}"
    allocations, requeues = _allocations_and_requeues(log)
    assert re.search(r"\(resumed from .*checkpoints/step\d+\)", log), log[-3000:]
    assert [s for s, _ in losses(r.run)] == list(range(1, STEPS + 1))  # each step once, none lost
    assert not (r.run / "stop.request").exists() and not (r.run / "stopped.json").exists()
    check_recorded(r.box, runtime, r.plan, r.run)
    print(f"job {r.job} ({runtime}): {allocations} allocations, {requeues} requeue(s)")
