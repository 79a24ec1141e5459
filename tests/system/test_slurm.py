"""`dsorch submit` against a real SLURM cluster (slurmctld, two slurmd, slurmdbd, MariaDB, munge)
that scripts/slurm-test-cluster.sh installs from Debian's packages and starts on loopback.

Nothing here is faked: jobs go through sbatch, run the bundled DeepSpeed entrypoint in 4 CPU
ranks over gloo across the two "nodes", and their states come from sacct.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..conftest import EXAMPLES, ROOT
from .harness import DSORCH

pytestmark = pytest.mark.slurm

PROFILES = Path(__file__).parents[1] / "profiles"
CLUSTER_SCRIPT = ROOT / "scripts" / "slurm-test-cluster.sh"


@pytest.fixture(scope="module")
def slurm_env(tmp_path_factory):
    """Start the loopback cluster (idempotent) and give the environment its clients need; stop it
    afterwards if this fixture started it, and check that no daemon is left behind."""
    was_up = subprocess.run(["bash", str(CLUSTER_SCRIPT), "status"], capture_output=True).returncode == 0
    t0 = time.monotonic()
    r = subprocess.run(["bash", str(CLUSTER_SCRIPT), "start"], capture_output=True, text=True, timeout=900)
    print(f"SLURM test cluster {'already up' if was_up else 'started'} in {time.monotonic() - t0:.1f} s")
    assert r.returncode == 0, f"the SLURM test cluster did not start:\n{r.stdout}\n{r.stderr}"
    conf = subprocess.run(["bash", str(CLUSTER_SCRIPT), "env"], capture_output=True, text=True,
                          check=True).stdout.strip().split("=", 1)[1].strip("'\"")
    env = dict(os.environ, SLURM_CONF=conf, DSORCH_PROFILES_DIR=str(PROFILES), DS_ACCELERATOR="cpu",
               OMP_NUM_THREADS="1")
    yield env
    if not was_up:
        subprocess.run(["bash", str(CLUSTER_SCRIPT), "stop"], capture_output=True, timeout=300, check=True)
        assert _live_daemons() == [], f"daemons left running after stop: {_live_daemons()}"


DAEMONS = {"slurmctld", "slurmd", "slurmd-wlm", "slurmdbd", "munged", "mariadbd", "slurmstepd"}


def _live_daemons() -> list[str]:
    """Cluster daemons still alive. Zombies do not count: a stopped daemon whose parent (the
    start script, long gone) cannot reap it stays in the process table until init does."""
    live = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except OSError:
            continue
        if fields.get("Name", "").strip() in DAEMONS and not fields.get("State", "").strip().startswith("Z"):
            live.append(f"{fields['Name'].strip()}({status.parent.name})")
    return live


def dsorch(env, cwd, *args, check=True, timeout=600):
    r = subprocess.run([DSORCH, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"dsorch {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r


def status(env, cwd) -> list[dict]:
    return json.loads(dsorch(env, cwd, "status", "--json").stdout)


def wait_for(env, cwd, job_id, predicate, timeout=300, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec = next(r for r in status(env, cwd) if r["job_id"] == job_id)
        if predicate(rec):
            return rec
        time.sleep(2)
    raise AssertionError(f"job {job_id}: timed out waiting for {what}; last record {rec}")


def submitted_id(result) -> str:
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("submitted job "))
    return line.split()[2]


def losses(run_dir: Path) -> list[tuple[int, float]]:
    # Step records only: an evaluation's record ("kind": "eval") has no training loss.
    records = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return [(r["step"], r["loss"]) for r in records if "kind" not in r]


def plan_tiny(env, cwd, cluster, out, *extra):
    dsorch(env, cwd, "plan", EXAMPLES / "tiny.yaml", "--cluster", cluster, "--out", out, *extra)


LAYOUT = ["--tp", "2", "--pp", "2", "--mbs", "4", "--zero", "1", "--no-sp", "--recompute", "none"]


def test_two_node_job_completes_with_the_local_runs_losses(slurm_env, tmp_path):
    env = slurm_env
    plan_tiny(env, tmp_path, "loopback", "plans/tp2pp2", *LAYOUT)
    plan_tiny(env, tmp_path, "local", "plans/tp2pp2-local", *LAYOUT)
    r = dsorch(env, tmp_path, "submit", "plans/tp2pp2", "--steps", "4", "--wait")
    job = submitted_id(r)
    assert "COMPLETED" in r.stdout
    rec = next(x for x in status(env, tmp_path) if x["job_id"] == job)
    assert rec["state"] == "COMPLETED" and rec["executor"] == "slurm" and rec["last_step"] == 4
    sacct = subprocess.run(["sacct", "-n", "-X", "-j", job, "-o", "State,NNodes,NTasks"], env=env,
                           capture_output=True, text=True).stdout.split()
    assert sacct[:2] == ["COMPLETED", "2"], sacct
    dsorch(env, tmp_path, "submit", "plans/tp2pp2-local", "--steps", "4", "--wait")
    runs = {r["plan_dir"]: Path(r["run_dir"]) for r in status(env, tmp_path)}
    slurm_losses, local_losses = losses(runs["plans/tp2pp2"]), losses(runs["plans/tp2pp2-local"])
    assert [s for s, _ in slurm_losses] == [1, 2, 3, 4]
    # Same layout, data and seed, same reduction order: the losses agree to fp32 round-off.
    for (s1, a), (s2, b) in zip(slurm_losses, local_losses):
        assert s1 == s2 and a == pytest.approx(b, rel=1e-6)
    out = dsorch(env, tmp_path, "logs", job, "--rank", "3").stdout
    assert "_log.out <==" in out


def test_failing_job_shows_failed_and_its_traceback(slurm_env, tmp_path):
    env = slurm_env
    plan_tiny(env, tmp_path, "loopback", "plans/p", *LAYOUT)
    (tmp_path / "bad.bin").write_bytes(b"\x00" * 64)
    (tmp_path / "bad.json").write_text("{this is not json")
    r = dsorch(env, tmp_path, "submit", "plans/p", "--steps", "2", "--data", "bad", "--wait", check=False)
    assert r.returncode == 1
    job = submitted_id(r)
    rec = next(x for x in status(env, tmp_path) if x["job_id"] == job)
    assert rec["state"] == "FAILED"
    assert "exited with code" in rec["error"] and "bad.json:1: not valid JSON" in rec["error"]
    st = dsorch(env, tmp_path, "status").stdout
    assert "FAILED" in st and "last lines of the error" in st and "full log" in st
    logs = dsorch(env, tmp_path, "logs", job).stdout
    assert "Traceback" in logs or "orchestrator.train:" in logs


def test_cancel_ends_a_running_job(slurm_env, tmp_path):
    env = slurm_env
    plan_tiny(env, tmp_path, "loopback", "plans/p", *LAYOUT)
    job = submitted_id(dsorch(env, tmp_path, "submit", "plans/p", "--steps", "100000", "--extend-schedule"))
    wait_for(env, tmp_path, job, lambda r: r["state"] == "RUNNING", timeout=120, what="RUNNING")
    r = dsorch(env, tmp_path, "cancel", job)
    assert f"cancelled job {job}" in r.stdout
    rec = next(x for x in status(env, tmp_path) if x["job_id"] == job)
    assert rec["state"] == "CANCELLED"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        sacct = subprocess.run(["sacct", "-n", "-X", "-j", job, "-o", "State"], env=env, capture_output=True,
                               text=True).stdout.split()
        if sacct and sacct[0].rstrip("+") == "CANCELLED":
            break
        time.sleep(2)
    assert sacct and sacct[0].rstrip("+") == "CANCELLED", sacct
    assert dsorch(env, tmp_path, "cancel", job, check=False).returncode == 2  # already ended


@pytest.mark.parametrize("how", ["scontrol-requeue", "submitit-preemption"])
def test_requeued_job_resumes_without_gap_or_repeat(slurm_env, tmp_path, how):
    # Paced at 0.3 s per step (the entrypoint's test hook), so that the requeue at step 12 lands
    # at least 14 s before the end on any machine; 60 steps, not more, keep the test near a minute.
    env = dict(slurm_env, DSORCH_TEST_MIN_STEP_SECONDS="0.3")
    plan_tiny(env, tmp_path, "loopback", "plans/p", *LAYOUT)
    steps = 60
    job = submitted_id(dsorch(env, tmp_path, "submit", "plans/p", "--steps", steps, "--extend-schedule", "--save-interval", "10"))
    wait_for(env, tmp_path, job, lambda r: (r["last_step"] or 0) >= 12, timeout=240, what="step 12")
    if how == "scontrol-requeue":
        subprocess.run(["scontrol", "requeue", job], env=env, check=True)
    else:
        # What SLURM does before preemption or a time limit (and submitit's own Job._interrupt):
        # SIGUSR2 to every task; the job checkpoints and submitit requeues it.
        subprocess.run(["scancel", "--signal=USR2", job], env=env, check=True)
    rec = wait_for(env, tmp_path, job, lambda r: r["state"] == "COMPLETED", timeout=420, what="COMPLETED")
    assert rec["requeues"] >= 1
    trajectory = losses(Path(rec["run_dir"]))
    assert [s for s, _ in trajectory] == list(range(1, steps + 1))
    starts = (Path(rec["run_dir"]) / "starts.jsonl").read_text().splitlines()
    assert len(starts) >= 2
    st = dsorch(env, tmp_path, "status").stdout
    assert "COMPLETED" in st


def _sacct_state(env, job: str) -> str:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"], env=env, capture_output=True,
                         text=True).stdout.split()
    return out[-1].rstrip("+") if out else "UNKNOWN"


@dataclass
class Sbatch:
    """A plan's job.sbatch submitted with plain sbatch from the plan directory, then left alone."""

    plan: Path
    env: dict
    job: str = ""

    def submit(self) -> Sbatch:
        r = subprocess.run(["sbatch", "--parsable", "job.sbatch"], cwd=self.plan, env=self.env, capture_output=True,
                           text=True, check=True)
        self.job = r.stdout.strip().split(";")[0]
        return self

    def log(self) -> str:
        """The job's output over all its allocations (--open-mode=append)."""
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.plan.glob("slurm-*.out")))

    def wait(self, timeout_s: float = 1500) -> tuple[str, str]:
        """Until the job ends: (final state, the job's output over all allocations)."""
        deadline = time.monotonic() + timeout_s
        state = "PENDING"
        while time.monotonic() < deadline:
            state = _sacct_state(self.env, self.job)
            if state in ENDED:
                break
            time.sleep(5)
        if state != "COMPLETED":
            subprocess.run(["scancel", self.job], env=self.env)
        return state, self.log()


# sacct's states of a job that has ended.
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def _allocations_and_requeues(log: str) -> tuple[int, int]:
    allocations = [int(a) for a in re.findall(r"^job.sbatch: job \d+ allocation (\d+)", log, re.M)]
    requeues = re.findall(r"^job.sbatch: stopped with a checkpoint .*; requeueing job", log, re.M)
    assert allocations == list(range(1, len(allocations) + 1)), log[-4000:]
    assert len(allocations) >= 2 and len(requeues) == len(allocations) - 1, log[-4000:]
    return len(allocations), len(requeues)


def _long_tiny_spec(tmp_path: Path, steps: int) -> Path:
    spec = tmp_path / "tiny-long.yaml"
    spec.write_text((EXAMPLES / "tiny.yaml").read_text().replace("train_tokens: 30720", f"steps: {steps}"))
    return spec


ONE_NODE_DP = ["--tp", "1", "--pp", "1", "--zero", "1", "--mbs", "4", "--recompute", "none", "--no-sp"]


# A FAKE launch.sh: ranks that never get past the step they resumed from. The bundled entrypoint
# always trains at least one step before it honours a stop request (train/loop/entry.py), so it cannot
# show this; the job script's requeue decision is what is under test, on the real SLURM.
STUCK_LAUNCH = """#!/bin/bash
# FAKE ranks (tests/system/test_slurm.py): wait for job.sbatch's stop request, then report a
# checkpoint of the step they started from, as the entrypoint reports one (stopped.json), and exit
# with its code for "stopped" (EXIT_STOPPED).
while [[ ! -f "$DSORCH_RUN_DIR/stop.request" ]]; do sleep 1; done
rm -f "$DSORCH_RUN_DIR/stop.request"
echo '{"step": 7, "signal": "stop.request", "time": 0}' > "$DSORCH_RUN_DIR/stopped.json"
exit 3
"""
TIME_LIMITED_STEPS = 240


@pytest.fixture(scope="module")
def time_limited_jobs(slurm_env, tmp_path_factory) -> dict[str, Sbatch]:
    """The plain-sbatch jobs that meet the 2-minute time limit of `loopback-short`, submitted at
    once: each waits for SLURM's clock, not for work, and they fit on the loopback nodes together
    (2 of a node's 4 CPUs each; job.sbatch's MASTER_PORT comes from the job id, so jobs on one
    host do not meet on torchrun's port). The module waits for the limits once, not three times."""
    tmp = tmp_path_factory.mktemp("time-limited")
    bin_path = f"{Path(sys.executable).parent}:{slurm_env['PATH']}"
    spec = _long_tiny_spec(tmp, TIME_LIMITED_STEPS)
    # Paced at 0.4 s per step (the entrypoint's test hook): 240 steps are 96 s of training, more
    # than one 2-minute allocation holds after start-up and SLURM's early warning, on any machine.
    deepspeed = dict(slurm_env, PATH=bin_path, DSORCH_TEST_MIN_STEP_SECONDS="0.4")
    megatron = dict(slurm_env, PATH=bin_path, MEGATRON_LM=str(Path(__file__).parents[1] / "fakes" / "megatron"),
                    FAKE_MEGATRON_ITERATION_SECONDS="0.4")
    jobs = {
        "deepspeed": Sbatch(tmp / "plans" / "long", deepspeed),  # both nodes, 4 ranks
        "megatron": Sbatch(tmp / "plans" / "m", megatron),
        "stuck": Sbatch(tmp / "plans" / "stuck", slurm_env),
    }
    dsorch(deepspeed, tmp, "plan", spec, "--cluster", "loopback-short", "--out", jobs["deepspeed"].plan, *ONE_NODE_DP)
    dsorch(megatron, tmp, "plan", spec, "--cluster", "loopback-short", "--runtime", "megatron", "--nodes", "1",
           "--out", jobs["megatron"].plan, *ONE_NODE_DP)
    stuck = jobs["stuck"].plan
    dsorch(slurm_env, tmp, "plan", EXAMPLES / "tiny.yaml", "--cluster", "loopback-short", "--nodes", "1", "--out",
           stuck, *ONE_NODE_DP)
    (stuck / "launch.sh").write_text(STUCK_LAUNCH)
    start = stuck / "run" / "checkpoints" / "step00000007"
    start.mkdir(parents=True)
    (start / "dsorch_manifest.json").write_text('{"step": 7, "files": {}}')
    for job in jobs.values():
        job.submit()
    yield jobs
    for job in jobs.values():
        subprocess.run(["scancel", job.job], env=job.env, capture_output=True)  # nothing, unless a test gave up


def test_plain_sbatch_requeues_itself_past_its_time_limit(time_limited_jobs):
    """The committed job.sbatch, submitted with plain sbatch by someone who never runs `dsorch
    submit`, for a job that needs several times its 2-minute limit, left alone: SLURM warns it
    before each limit, every rank checkpoints at the same step, the job requeues itself, and it
    ends COMPLETED with every step exactly once."""
    sbatch = time_limited_jobs["deepspeed"]
    state, log = sbatch.wait()
    assert state == "COMPLETED", f"job {sbatch.job} ended {state}:\n{log[-4000:]}"
    allocations, requeues = _allocations_and_requeues(log)
    assert len(re.findall(r"\(resumed from .*checkpoints/step\d+\)", log)) == requeues
    run = sbatch.plan / "run"
    assert [s for s, _ in losses(run)] == list(range(1, TIME_LIMITED_STEPS + 1))  # each step once, none lost
    assert not (run / "stop.request").exists() and not (run / "stopped.json").exists()
    print(f"job {sbatch.job}: {allocations} allocations of at most 2 minutes for {TIME_LIMITED_STEPS} steps")


def test_plain_sbatch_of_a_megatron_plan_requeues_through_megatrons_signal_handler(time_limited_jobs):
    """The same for --runtime megatron: job.sbatch passes SIGUSR2 to the step, torchrun survives it,
    the ranks (a FAKE pretrain_gpt.py with Megatron-LM's --exit-signal-handler behaviour: Megatron-LM
    needs CUDA) checkpoint and exit 0, and the job requeues while the tracker file has advanced and is
    below --train-iters."""
    sbatch = time_limited_jobs["megatron"]
    state, log = sbatch.wait()
    assert state == "COMPLETED", f"job {sbatch.job} ended {state}:\n{log[-4000:]}"
    allocations, _ = _allocations_and_requeues(log)
    ckpt = sbatch.plan / "checkpoints"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == str(TIME_LIMITED_STEPS)
    done = re.findall(r"^iteration (\d+)$", (ckpt / "iterations.log").read_text(), re.M)
    assert [int(i) for i in done] == list(range(1, TIME_LIMITED_STEPS + 1))  # each iteration once, none lost
    print(f"job {sbatch.job}: {allocations} allocations of at most 2 minutes for {TIME_LIMITED_STEPS} iterations")


def test_plain_sbatch_does_not_requeue_an_allocation_that_made_no_progress(time_limited_jobs):
    """job.sbatch (deepspeed runtime) requeues on its time-limit warning only when the stop's step
    (stopped.json) is past the newest checkpoint at the allocation's start: ranks that stop where
    they began end the job FAILED after one allocation instead of requeueing it forever."""
    sbatch = time_limited_jobs["stuck"]
    # One 2-minute allocation, then a second one were it requeued: stop waiting well past the first.
    state, log = sbatch.wait(timeout_s=240)
    assert re.findall(r"^job.sbatch: job \d+ allocation (\d+)", log, re.M) == ["1"], log[-4000:]
    assert state == "FAILED", f"job {sbatch.job} ended {state}:\n{log[-4000:]}"
    assert "stopped at step 7; this allocation started at step 7 and training ends at step 30: no progress" in log


def test_registry_consistent_under_concurrent_dsorch_processes(slurm_env, tmp_path):
    env = slurm_env
    plan_tiny(env, tmp_path, "loopback", "plans/p", *LAYOUT)
    # 10 processes at once: dry runs and status calls read the registry, 4 real submits race for
    # the same plan; exactly one submit may win.
    calls = [["submit", "plans/p", "--dry-run"]] * 3 + [["status", "--json"]] * 3 + \
            [["submit", "plans/p", "--steps", "100000", "--extend-schedule"]] * 4
    with ThreadPoolExecutor(len(calls)) as pool:
        results = list(pool.map(lambda a: dsorch(env, tmp_path, *a, check=False), calls))
    for args, r in zip(calls, results):
        if args[0] == "status":
            assert r.returncode == 0, r.stderr
            json.loads(r.stdout)
        elif "--dry-run" in args:
            assert r.returncode == 0 and "#SBATCH --nodes=2" in r.stdout, r.stderr
    submits = [r for a, r in zip(calls, results) if a[0] == "submit" and "--dry-run" not in a]
    accepted = [r for r in submits if r.returncode == 0]
    assert len(accepted) == 1, [r.stdout + r.stderr for r in submits]
    assert all("already has a job pending or running" in r.stderr for r in submits if r.returncode != 0)
    records = status(env, tmp_path)
    assert len(records) == 1 and records[0]["job_id"] == submitted_id(accepted[0])
    dsorch(env, tmp_path, "cancel", records[0]["job_id"])


def test_hostile_values_run_nothing_on_a_real_cluster(slurm_env, tmp_path):
    env = dict(slurm_env)
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "evil.yaml").write_text(textwrap.dedent("""\
        extends: loopback
        slurm:
          env:
            EVIL: "$(touch CANARY1); `touch CANARY2`; echo 'x' \\"y\\" && touch CANARY3"
          extra: {comment: "a b; touch CANARY4 $(touch CANARY5)"}
        """))
    (profiles / "loopback.yaml").write_text((PROFILES / "loopback.yaml").read_text())
    env["DSORCH_PROFILES_DIR"] = str(profiles)
    exp = tmp_path / "exp dir $(touch CANARY6); x"
    exp.mkdir()
    plan_tiny(env, exp, "evil", "plan `touch CANARY7` 'q'", *LAYOUT)
    script = dsorch(env, exp, "submit", "plan `touch CANARY7` 'q'", "--dry-run").stdout
    assert "#SBATCH --comment='a b; touch CANARY4 $(touch CANARY5)'" in script
    r = dsorch(env, exp, "submit", "plan `touch CANARY7` 'q'", "--steps", "1", "--wait")
    assert "COMPLETED" in r.stdout
    canaries = sorted(p.name for p in Path("/").glob("CANARY*")) + sorted(p.name for p in tmp_path.rglob("CANARY*"))
    assert canaries == [], f"hostile values were executed: {canaries}"


def test_an_unreachable_controller_is_a_clear_error_and_no_ghost_row(slurm_env, tmp_path):
    """The real sbatch, pointed at a controller port nothing listens on (a copy of the loopback
    cluster's slurm.conf): one paragraph with sbatch's own words, no "pending" row, no files."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    conf_dir = tmp_path / "etc"
    conf_dir.mkdir()
    text = Path(slurm_env["SLURM_CONF"]).read_text()
    (conf_dir / "slurm.conf").write_text(re.sub(r"(?m)^SlurmctldPort=\d+", f"SlurmctldPort={free}", text))
    env = dict(slurm_env, SLURM_CONF=str(conf_dir / "slurm.conf"))
    plan_tiny(env, tmp_path, "loopback", "plans/p", *LAYOUT)
    r = dsorch(env, tmp_path, "submit", "plans/p", "--steps", "1", check=False, timeout=900)
    assert r.returncode == 2, r.stdout + r.stderr
    err = " ".join(r.stderr.split())
    assert "the scheduler refused the job" in err and "Traceback" not in r.stderr, err
    assert status(env, tmp_path) == []
    jobs = tmp_path / ".dsorch" / "jobs"
    assert not jobs.exists() or list(jobs.rglob("*")) == []


# A model whose layouts differ in memory by far more than a CPU rank's resident set varies between
# environments (a fresh CI clone measured +0.06 GiB over a warm checkout): the vocabulary's
# embedding and head (2 x 32768 x 384 parameters) are whole on every rank of the TP/ZeRO layouts and
# a quarter of it on the tp2 x pp2 one. Measured peaks, 8 steps on the loopback cluster: tp2 x pp2
# 0.63 GiB; tp2 ZeRO-2 0.82, tp1 ZeRO-2 0.98, ZeRO-3 1.08.
TRIAL_SPEC = """\
name: trialmed
source: "a 4-layer test model with a large vocabulary, so that its layouts differ in memory"
model: {num_layers: 4, hidden_size: 384, ffn_hidden_size: 1024, num_attention_heads: 8, num_kv_heads: 4,
        vocab_size: 65536, activation: swiglu, tied_embeddings: false, max_position_embeddings: 64}
training:
  seq_length: 32
  global_batch_size: 8
  precision: fp32
  flash_attention: false
  optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup_steps: 2, weight_decay: 0.0}
"""
# The loopback cluster with 0.82 GiB "GPUs" (the entrypoint's CPU stand-in for an OOM applies it to
# the ranks' peak resident set), in the middle of the measured gap between the pipeline trial
# (tp2 pp2, 0.70 GiB) and the next (tp2 ZeRO-2, 0.94 GiB; ZeRO-3 1.15, data parallel 1.25) with a
# 64K vocabulary; with 32K the gap had shrunk to 0.77 against 0.82 and the pipeline trial ran out
# of memory in a fresh clone.
SMALL_MEMORY_PROFILE = """\
name: loopback-smallmem
description: the loopback cluster with 0.82 GiB "GPUs" (tests/system/test_slurm.py, dsorch trial)
extends: loopback
gpu: {memory_gib: 0.82}
memory_overhead_gib: 0.2
"""


def test_trial_array_on_the_loopback_cluster_with_an_out_of_memory_trial(slurm_env, tmp_path):
    """dsorch trial on the 2-node cluster, without --wait: one SLURM job array of at least 3
    layouts (one element at a time), --status while it runs, --collect refused until it ends, then
    --collect --wait: predicted vs measured, the out-of-memory trials reported as such and counted
    as memory evidence, the calibrated profile written and the re-plan taken from it."""
    import yaml

    from orchestrator.plandir.reader import load_plan_dir
    from orchestrator.validate.plan_dir import validate_path

    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "loopback.yaml").write_text((PROFILES / "loopback.yaml").read_text())
    (profiles / "loopback-smallmem.yaml").write_text(SMALL_MEMORY_PROFILE)
    (tmp_path / "trialmed.yaml").write_text(TRIAL_SPEC)
    env = dict(slurm_env, DSORCH_PROFILES_DIR=str(profiles))
    r = dsorch(env, tmp_path, "trial", "trialmed.yaml", "--cluster", "loopback-smallmem", "--top", "1",
               "--steps", "6")
    assert "submitted" in r.stdout and "(slurm)" in r.stdout
    trial_dir = tmp_path / "trials" / "trialmed-loopback-smallmem"
    manifest = yaml.safe_load((trial_dir / "trial.yaml").read_text())
    ids = [t["job_id"] for t in manifest["trials"]]
    array = ids[0].split("_")[0]
    assert len(ids) >= 2 and ids == [f"{array}_{i}" for i in range(len(ids))]
    script = next((tmp_path / ".dsorch" / "jobs").glob("*/*_submission.sh")).read_text()
    assert re.search(r"#SBATCH --array=0-\d+%1", script), script
    st = dsorch(env, tmp_path, "trial", "--status", str(trial_dir))
    assert all(i in st.stdout for i in ids)
    early = dsorch(env, tmp_path, "trial", "--collect", str(trial_dir), check=False)
    if early.returncode != 0:  # the array is still running (it takes a minute)
        assert "still queued or running" in early.stderr and "Traceback" not in early.stderr
    r = dsorch(env, tmp_path, "trial", "--collect", str(trial_dir), "--wait", timeout=900)
    results = yaml.safe_load((trial_dir / "results.yaml").read_text())
    outcomes = {t["trial"]: t["outcome"] for t in results["trials"]}
    ooms = [k for k, v in outcomes.items() if v == "oom"]
    oks = [k for k, v in outcomes.items() if v == "ok"]
    assert ooms and oks and len(ooms) + len(oks) == len(ids), outcomes
    assert "ran out of memory" in r.stdout and "oom" in r.stdout
    for name in ooms:  # the entrypoint's stand-in, in the rank's own log
        job = ids[[t["dir"] for t in manifest["trials"]].index(name)]
        logs = dsorch(env, tmp_path, "logs", job, "--rank", "0", check=False)
        assert "out of memory (CPU stand-in" in logs.stdout + logs.stderr
    prof = yaml.safe_load((profiles / "loopback-smallmem-measured.yaml").read_text())
    assert prof["extends"] == "loopback-smallmem" and prof["memory_overhead_gib"] > 0.2  # the OOMs raised it
    winner = tmp_path / "plans" / "trialmed-loopback-smallmem-measured"
    assert validate_path(winner) == []
    pd = load_plan_dir(winner)
    assert pd.doc.inputs.cluster_profile.name == "loopback-smallmem-measured"
    oom_layouts = {t["layout"] for t in results["trials"] if t["outcome"] == "oom"}
    assert pd.layout.short() not in oom_layouts
    assert {m["trial"]: m["outcome"] for m in pd.doc.evidence["measured"]} == outcomes
    # The winner runs: one command from the re-planned directory to a finished job.
    done = dsorch(env, tmp_path, "submit", str(winner), "--steps", "2", "--wait", timeout=600)
    assert "COMPLETED" in done.stdout


def test_a_run_that_lost_a_node_is_replanned_onto_the_rest_and_completes(slurm_env, tmp_path):
    """A 2-node job; one node is drained mid-run and the job preempted (SIGUSR2: it checkpoints and
    requeues itself). Its requeue waits for 2 nodes that are not there. `dsorch replan JOB --nodes 1`
    plans the spec for the one node left and converts the checkpoint; the pending job is cancelled
    and the new plan, submitted with --resume-from, finishes the run on the other node: every step
    once, in one metrics.jsonl."""
    env = slurm_env
    plan_tiny(env, tmp_path, "loopback", "plans/p", *LAYOUT)
    steps = 40
    job = submitted_id(dsorch(env, tmp_path, "submit", "plans/p", "--steps", steps, "--extend-schedule",
                                "--save-interval", "5"))
    wait_for(env, tmp_path, job, lambda r: (r["last_step"] or 0) >= 8, timeout=240, what="step 8")
    nodes = subprocess.run(["squeue", "-h", "-j", job, "-o", "%N"], env=env, capture_output=True, text=True,
                           check=True).stdout.strip()
    names = subprocess.run(["scontrol", "show", "hostnames", nodes], env=env, capture_output=True, text=True,
                           check=True).stdout.split()
    assert len(names) == 2, names
    lost = names[1]
    subprocess.run(["scontrol", "update", f"nodename={lost}", "state=drain", "reason=dsorch-test"], env=env, check=True)
    try:
        subprocess.run(["scancel", "--signal=USR2", job], env=env, check=True)
        # The requeued job waits: it needs 2 nodes and one is drained.
        wait_for(env, tmp_path, job, lambda r: r["state"] in ("PENDING", "REQUEUED"), timeout=240,
                 what="requeued and pending")
        time.sleep(5)  # a scheduler pass: it stays pending
        assert next(x for x in status(env, tmp_path) if x["job_id"] == job)["state"] in ("PENDING", "REQUEUED")
        r = dsorch(env, tmp_path, "replan", job, "--nodes", "1")
        assert "re-planned for 1 x 2 of loopback" in r.stdout, r.stdout
        new_plan = tmp_path / "plans" / "p-1n"
        run_dir = next(Path(x["run_dir"]) for x in status(env, tmp_path) if x["job_id"] == job)
        dsorch(env, tmp_path, "cancel", job)
        done = dsorch(env, tmp_path, "submit", new_plan, "--resume-from", run_dir, "--steps", steps,
                      "--extend-schedule", "--wait",
                      timeout=600)
        assert "COMPLETED" in done.stdout
        new_job = submitted_id(done)
        ran_on = subprocess.run(["sacct", "-n", "-X", "-P", "-j", new_job, "-o", "NodeList"], env=env,
                                capture_output=True, text=True).stdout.split()
        assert ran_on and lost not in ran_on[0], ran_on
    finally:
        subprocess.run(["scontrol", "update", f"nodename={lost}", "state=resume"], env=env)
    trajectory = losses(run_dir)
    assert [s for s, _ in trajectory] == list(range(1, steps + 1))
    records = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "kind" not in r]
    assert records[0]["layout"]["pp"] == 2 and records[-1]["layout"]["tp"] * records[-1]["layout"]["pp"] * \
        records[-1]["layout"]["dp"] == 2  # the last steps ran on the one node's 2 ranks


def test_doctor_checks_reachability_and_measures_the_fabric_on_the_loopback_cluster(slurm_env, tmp_path):
    """dsorch doctor on the 2-node cluster: one sbatch job of 4 gloo ranks, every pair reached,
    all-reduce and all-gather swept within and across the nodes, set against the profile, and
    --write stores the measured figures in a profile that extends the original and plans."""
    import yaml

    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "loopback.yaml").write_text((PROFILES / "loopback.yaml").read_text())
    env = dict(slurm_env, DSORCH_PROFILES_DIR=str(profiles))
    r = dsorch(env, tmp_path, "doctor", "--cluster", "loopback", "--max-size", "1", "--iters", "3", "--write",
               timeout=900)
    assert "every rank reached every other (all-reduce exact; pairwise sends checked)" in r.stdout, r.stdout
    assert "4 ranks on 2 node(s) (node1, node2), gloo" in r.stdout
    result = json.loads(next((tmp_path / ".dsorch" / "doctor").glob("loopback-*/doctor.json")).read_text())
    groups = {(x["group"], x["op"], x["ranks"]) for x in result["results"]}
    assert {("world", "all_reduce", 4), ("intra-node", "all_gather", 2), ("inter-node", "all_reduce", 2)} <= groups
    intra = max(x["busbw_gbs"] for x in result["results"] if x["group"] == "intra-node")
    assert f"intra-node: peak bus bandwidth {intra:.3g} GB/s" in r.stdout
    written = yaml.safe_load((profiles / "loopback-doctor.yaml").read_text())
    assert written["extends"] == "loopback"
    assert written["intra_node"]["bandwidth_gbps"] == pytest.approx(2 * intra, rel=1e-3)
    assert written["inter_node"]["bandwidth_gbps"] > 0 and written["inter_node"]["latency_us"] > 0
    # The written profile plans, and its figures are the ones used.
    p = dsorch(env, tmp_path, "profiles", "loopback-doctor", "--json")
    assert json.loads(p.stdout)["intra_node"]["bandwidth_gbps"] == written["intra_node"]["bandwidth_gbps"]
    dsorch(env, tmp_path, "plan", EXAMPLES / "tiny.yaml", "--cluster", "loopback-doctor", "--no-write")


def test_dsorch_submit_runs_a_megatron_plan_on_two_nodes(slurm_env, tmp_path):
    """`dsorch submit` of a --runtime megatron plan: one task per node runs launch.sh, whose torchrun
    joins the other node's (NNODES 2, the first node's NodeAddr as master) with 2 ranks each of a FAKE
    pretrain_gpt.py (Megatron-LM needs CUDA). The iteration lines come from the last rank, on the second
    node; rank 0's memory line from the first: metrics.jsonl has both, and status and logs show them."""
    env = dict(slurm_env, PATH=f"{Path(sys.executable).parent}:{slurm_env['PATH']}",
               MEGATRON_LM=str(Path(__file__).parents[1] / "fakes" / "megatron"), FAKE_MEGATRON_ITERATION_SECONDS="0.2")
    plan_tiny(env, tmp_path, "loopback", "plans/m", "--runtime", "megatron", *LAYOUT)
    r = dsorch(env, tmp_path, "submit", "plans/m", "--wait")
    assert "COMPLETED at step 30, loss 2.5000" in r.stdout, r.stdout + r.stderr  # the fake's 10 / (1 + 30/10)
    (job,) = status(env, tmp_path)
    run = Path(job["run_dir"])
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, 31)) and steps[-1]["mem_kind"] == "cuda_max_allocated"
    first, last = (dsorch(env, tmp_path, "logs", job["job_id"], "--rank", str(n)).stdout for n in (0, 1))
    assert "[Rank 0] (after 1 iterations) memory (MB)" in first and " iteration " not in first
    assert re.search(r"iteration +30/ +30 \| consumed samples", last)
