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
from pathlib import Path

import pytest

from ..conftest import EXAMPLES, ROOT
from .test_slurm import (  # noqa: F401  (slurm_env is a fixture)
    PROFILES,
    _allocations_and_requeues,
    _sacct_state,
    dsorch,
    losses,
    slurm_env,
    status,
    submitted_id,
    wait_for,
)

pytestmark = pytest.mark.slurm

FAKES = Path(__file__).parents[1] / "fakes"
ONE_NODE = ["--nodes", "1", "--tp", "1", "--pp", "1", "--zero", "1", "--mbs", "4", "--recompute", "none", "--no-sp"]
STEPS = 30  # examples/tiny.yaml's schedule


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


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_dsorch_submit_in_a_container_survives_a_preemption(slurm_env, tmp_path, runtime):
    box = container_profile(tmp_path, runtime)
    env = job_env(slurm_env, box)
    dsorch(env, tmp_path, "plan", EXAMPLES / "tiny.yaml", "--cluster", "boxed", "--out", "plans/p", *ONE_NODE)
    job = submitted_id(dsorch(env, tmp_path, "submit", "plans/p", "--save-interval", "10"))
    wait_for(env, tmp_path, job, lambda r: (r["last_step"] or 0) >= 4, timeout=240, what="step 4")
    # SLURM's warning before preemption or the time limit, to every task (inside the container):
    # each rank checkpoints, rank 0 leaves requeue.request, the batch script requeues on the host.
    subprocess.run(["scancel", "--signal=USR2", job], env=env, check=True)
    rec = wait_for(env, tmp_path, job, lambda r: r["state"] in ("COMPLETED", "FAILED"), timeout=360,
                   what="the end")
    assert rec["state"] == "COMPLETED", rec
    run = Path(rec["run_dir"])
    assert rec["requeues"] >= 1 and len((run / "starts.jsonl").read_text().splitlines()) >= 2
    assert [s for s, _ in losses(run)] == list(range(1, STEPS + 1))  # each step once, none lost
    assert not (run / "requeue.request").exists()
    check_recorded(box, runtime, (tmp_path / "plans" / "p").resolve(), run)
    assert any(r["job_id"] == job for r in status(env, tmp_path))


@pytest.mark.parametrize("runtime", ["apptainer", "pyxis"])
def test_plain_sbatch_in_a_container_survives_a_preemption(slurm_env, tmp_path, runtime):
    box = container_profile(tmp_path, runtime)
    env = job_env(slurm_env, box)
    plan = tmp_path / "plans" / "p"
    dsorch(env, tmp_path, "plan", EXAMPLES / "tiny.yaml", "--cluster", "boxed", "--out", plan, *ONE_NODE)
    r = subprocess.run(["sbatch", "--parsable", "job.sbatch"], cwd=plan, env=env, capture_output=True, text=True,
                       check=True)
    job = r.stdout.strip().split(";")[0]
    run = plan / "run"
    deadline = time.monotonic() + 360
    while time.monotonic() < deadline and steps_done(run) < 4:
        time.sleep(1)
    # What SLURM sends before a time limit (--signal=B:USR2): to the batch script, on the host; its
    # trap touches the stop file, which rank 0 reads inside the container.
    subprocess.run(["scancel", "--batch", "--signal=USR2", job], env=env, check=True)
    deadline = time.monotonic() + 360
    state = "PENDING"
    while time.monotonic() < deadline and state not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
        time.sleep(3)
        state = _sacct_state(env, job)
    log = "\n".join(p.read_text(errors="replace") for p in sorted(plan.glob("slurm-*.out")))
    if state != "COMPLETED":
        subprocess.run(["scancel", job], env=env)
    assert state == "COMPLETED", f"job {job} ended {state}:\n{log[-4000:]}"
    allocations, requeues = _allocations_and_requeues(log)
    assert re.search(r"\(resumed from .*checkpoints/step\d+\)", log), log[-3000:]
    assert [s for s, _ in losses(run)] == list(range(1, STEPS + 1))  # each step once, none lost
    assert not (run / "stop.request").exists() and not (run / "stopped.json").exists()
    check_recorded(box, runtime, plan, run)
    print(f"job {job} ({runtime}): {allocations} allocations, {requeues} requeue(s)")
