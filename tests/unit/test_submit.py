"""`dsorch submit` (orchestrator/cli/submit.py, run/submission.py) refuses bad input, a damaged or
changed plan directory too, with one paragraph, exit code 2 and nothing submitted.
(The jobs themselves run in tests/system/test_slurm.py and, for --cluster local, there too.)"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from orchestrator.cli.main import main
from orchestrator.spec.sbatch import parse_slurm_time


@pytest.fixture
def planned(runner, in_tmp):
    r = runner.invoke(main, ["plan", "examples/llama3-8b.yaml", "--cluster", "dgx16", "--nodes", "2", "--out",
                             "plans/l8"])
    assert r.exit_code == 0, r.output
    return in_tmp


def submit(runner, *args, env=None):
    return runner.invoke(main, ["submit", *map(str, args)], env=env)



@pytest.mark.parametrize("args, message", [
    (["plans/missing"], "plan directory plans/missing does not exist; write one with `dsorch plan SPEC --cluster NAME"),
    (["plans/l8", "--cluster", "dgx61"], "unknown cluster profile 'dgx61'. Did you mean 'dgx16'?"),
    (["plans/l8", "--cluster", "hgx-h200-ndr"], "plans/l8 was planned for cluster 'dgx16' (2 x 8), not 'hgx-h200-ndr'"),
    (["plans/l8", "--nodes", "4"], "plans/l8 was planned for 2 nodes, not 4; re-plan with --nodes 4."),
    (["plans/l8", "--data", "nowhere"], "--data nowhere: no such dataset (NAME.bin with NAME.idx or NAME.json)"),
])
def test_bad_submissions(runner, planned, args, message):
    r = submit(runner, *args)
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split())
    assert "Traceback" not in r.output
    assert runner.invoke(main, ["status", "--json"]).output.strip() == "[]"


def test_not_a_plan_directory(runner, planned):
    (planned / "empty").mkdir()
    r = submit(runner, "empty")
    assert r.exit_code == 2 and "empty has no plan.yaml file, so it is not a plan directory" in r.output


def test_missing_sbatch_suggests_local(runner, planned, tmp_path):
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    r = submit(runner, "plans/l8", env={"PATH": str(empty_bin)})
    assert r.exit_code == 2
    assert "sbatch and srun are not on PATH" in r.output and "--cluster local" in r.output
    assert runner.invoke(main, ["status", "--json"]).output.strip() == "[]"


def test_tampered_plan_is_not_submitted(runner, planned):
    f = planned / "plans" / "l8" / "ds_config.json"
    f.write_text(f.read_text().replace('"train_batch_size": 512', '"train_batch_size": 511'))
    r = submit(runner, "plans/l8", "--dry-run")
    assert r.exit_code == 2 and "ds_config.json was changed after dsorch wrote it" in r.output


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "plan.yaml").write_bytes(b"\xff\xfe runtime"), "plan.yaml: not UTF-8 text"),
    (lambda d: ((d / "plan.yaml").unlink(), (d / "plan.yaml").mkdir()), "plan.yaml: not a regular file"),
    (lambda d: (d / "plan.yaml").write_text((d / "plan.yaml").read_text().replace(
        "\ncluster:\n  name: dgx16\n  nodes: 2\n", "\ncluster:\n  name: dgx16\n", 1)),
     "cluster.nodes: Field required"),
    (lambda d: (d / "launch.sh").write_text("#!/bin/bash\ntouch PWNED\n"), "launch.sh was changed after dsorch"),
    (lambda d: (d / "job.sbatch").unlink(), "job.sbatch is missing"),
])
def test_submit_of_a_broken_plan_is_one_paragraph(exp, runner, damage, message):
    assert runner.invoke(main, ["plan", "examples/llama3-8b.yaml", "--nodes", "2", "--out", "plans/p"]).exit_code == 0
    damage(exp / "plans" / "p")
    r = runner.invoke(main, ["submit", "plans/p", "--dry-run"])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, r.output
    (exp / "afile").write_text("x")
    r = runner.invoke(main, ["submit", "afile", "--dry-run"])
    assert r.exit_code == 2 and "is a file, not a plan directory" in r.output


@pytest.fixture
def megatron_plan(runner, planned):
    assert runner.invoke(main, ["plan", "examples/llama3-8b.yaml", "--cluster", "dgx16", "--nodes", "2", "--runtime",
                                "megatron", "--out", "plans/m"]).exit_code == 0
    return planned / "plans" / "m"


def test_a_megatron_plan_needs_a_megatron_lm_checkout(runner, megatron_plan):
    r = submit(runner, "plans/m", "--dry-run", env={"MEGATRON_LM": None})
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "slurm.env.MEGATRON_LM" in r.output and "export MEGATRON_LM=/path/to/Megatron-LM" in r.output
    r = submit(runner, "plans/m", "--dry-run", "--data", "x", env={"MEGATRON_LM": "/opt/megatron-lm"})
    assert r.exit_code == 2 and "--data and --switch-data are for the bundled entrypoint" in " ".join(r.output.split())
    assert runner.invoke(main, ["status", "--json"]).output.strip() == "[]"


def test_a_megatron_plan_runs_one_task_per_node_with_all_its_gpus(runner, megatron_plan):
    """As job.sbatch's megatron branch: one task per node runs launch.sh, whose torchrun starts the
    node's 8 ranks; the task has the node's GPUs and its CPUs (12 per GPU in dgx16)."""
    r = submit(runner, "plans/m", "--dry-run", env={"MEGATRON_LM": "/opt/megatron-lm"})
    assert r.exit_code == 0, r.output
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --cpus-per-task=96", "#SBATCH --signal=USR2@90"):
        assert line in r.output, line


def test_dry_run_prints_the_sbatch_script_and_submits_nothing(runner, planned):
    r = submit(runner, "plans/l8", "--dry-run")
    assert r.exit_code == 0, r.output
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --cpus-per-task=12", "#SBATCH --time=2880", "#SBATCH --partition=gpu", "#SBATCH --exclusive",
                 "#SBATCH --signal=USR2@90", "module load cuda/12.4 nccl", "export NCCL_IB_HCA=mlx5",
                 "#SBATCH --job-name=dsorch-llama3-8b"):
        assert line in r.output, line
    assert runner.invoke(main, ["status", "--json"]).output.strip() == "[]"


@pytest.mark.parametrize("text, minutes", [("30", 30), ("1:30", 2), ("02:00:00", 120), ("48:00:00", 2880),
                                           ("1-00:00:00", 1440), ("2-12", 3600), ("1-01:30", 1530)])
def test_slurm_time_limits(text, minutes):
    assert parse_slurm_time(text) == minutes


def test_status_logs_cancel_with_no_jobs(runner, in_tmp):
    assert "no jobs submitted from this experiment directory yet" in runner.invoke(main, ["status"]).output
    for cmd in (["logs", "12"], ["cancel", "12"]):
        r = runner.invoke(main, cmd)
        assert r.exit_code == 2 and "no job '12'" in r.output


def test_a_refused_submission_leaves_no_row_and_no_files(runner, planned, tmp_path):
    """sbatch refuses (a FAKE sbatch standing in for a scheduler that says no): one paragraph with
    sbatch's words, no registry row, nothing of submitit's left in .dsorch/jobs/."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: Batch job submission failed: Invalid partition "
                                 "name specified' >&2\nexit 1\n")
    (fake / "srun").write_text("#!/bin/sh\nexit 0\n")
    for f in fake.iterdir():
        f.chmod(0o755)
    r = submit(runner, "plans/l8", env={"PATH": f"{fake}:{os.environ['PATH']}"})
    assert r.exit_code == 2 and "the scheduler refused the job" in r.output and "Invalid partition" in r.output
    assert "Traceback" not in r.output
    assert runner.invoke(main, ["status", "--json"]).output.strip() == "[]"
    jobs = planned / ".dsorch" / "jobs"
    assert not jobs.exists() or list(jobs.rglob("*")) == [], list(jobs.rglob("*"))


def test_a_losing_submit_keeps_the_winners_files(runner, planned, tmp_path, monkeypatch):
    """Two submits of one plan race: the loser waits for the registry lock while the winner writes
    its submitit files into the shared .dsorch/jobs/<plan>/ folder. The loser's cleanup must not
    take them (the winner's job would then fail to start: CI stop 17)."""
    import contextlib

    from orchestrator.errors import DsorchError
    from orchestrator.run.registry import Registry

    fake = tmp_path / "fakebin"
    fake.mkdir()
    for name in ("sbatch", "srun"):
        (fake / name).write_text("#!/bin/sh\nexit 0\n")
        (fake / name).chmod(0o755)
    winners = planned / ".dsorch" / "jobs" / "l8" / "4242_submitted.pkl"

    @contextlib.contextmanager
    def lost_the_race(self, plan_dir, force):
        winners.parent.mkdir(parents=True, exist_ok=True)
        winners.write_bytes(b"the winner's job")  # written while this process waited for the lock
        raise DsorchError(f"plan {plan_dir} already has a job pending or running: 4242 (PENDING).")
        yield

    monkeypatch.setattr(Registry, "reserve", lost_the_race)
    r = submit(runner, "plans/l8", env={"PATH": f"{fake}:{os.environ['PATH']}"})
    assert r.exit_code == 2 and "already has a job pending or running" in r.output, r.output
    assert winners.read_bytes() == b"the winner's job"


def test_a_failed_write_leaves_no_directories_behind(tmp_path):
    from orchestrator.errors import OutputError
    from orchestrator.plandir.writer import write_plan_dir

    out = tmp_path / "a" / "b" / ("x" * 300)  # the directory itself cannot be created
    with pytest.raises(OutputError):
        write_plan_dir(out, {"plan.yaml": "x: 1\n"})
    assert list(tmp_path.iterdir()) == []


def test_steps_past_the_plans_schedule_are_refused_before_queueing(runner, planned):
    from orchestrator.plandir.reader import load_plan_dir

    total = load_plan_dir("plans/l8").spec.training.train_steps
    r = submit(runner, "plans/l8", "--steps", total + 1, "--dry-run")
    text = " ".join(r.output.split())
    assert r.exit_code == 2, r.output
    assert f"--steps {total + 1} is past the {total} steps plans/l8 was planned for" in text
    assert "submit with --extend-schedule" in text and "Traceback" not in r.output
    r = submit(runner, "plans/l8", "--steps", total + 1, "--extend-schedule", "--dry-run")
    assert r.exit_code == 0, r.output
    from orchestrator.run.jobs import TrainingJob

    # The job's training command carries it (the sbatch script only unpickles the job).
    assert "--extend-schedule" in TrainingJob("p", "r", total + 1, extend_schedule=True).command()
    assert "--extend-schedule" not in TrainingJob("p", "r", total).command()


def test_a_job_that_failed_since_the_last_status_does_not_block_the_next_submit(runner, planned, tmp_path):
    """The registry holds the state it last saw: a job it still has as PENDING that the scheduler
    (a FAKE sacct) reports FAILED is refreshed at submit, so `submit --resume` continues the run
    instead of refusing it as "pending or running" (found by scripts/bench_chaos.py)."""
    from orchestrator.run.registry import Registry

    fake = tmp_path / "fakebin"
    fake.mkdir()
    scripts = {"sbatch": "echo 'Submitted batch job 4243'", "srun": "exit 0",
               "sacct": "echo 'JobID|State|NodeList'; echo '4242|FAILED|node[1-2]'"}
    for name, body in scripts.items():
        (fake / name).write_text(f"#!/bin/sh\n{body}\n")
        (fake / name).chmod(0o755)
    env = {"PATH": f"{fake}:{os.environ['PATH']}"}
    first = submit(runner, "plans/l8", env=env)  # job 4243, renamed 4242 below: the earlier job
    assert first.exit_code == 0, first.output
    reg = Registry(planned)
    reg.update(reg.all()[0].key, job_id="4242", state="PENDING")
    r = submit(runner, "plans/l8", "--resume", env=env)
    assert r.exit_code == 0 and "submitted job 4243" in r.output, r.output
    assert [(x.job_id, x.state) for x in reg.all()] == [("4242", "FAILED"), ("4243", "PENDING")]


def test_a_submission_checkpoints_at_the_plans_interval_unless_told_otherwise(planned):
    import yaml

    from orchestrator.plandir.reader import load_plan_dir
    from orchestrator.run.submission import prepare_submission

    plan_dir = planned / "plans" / "l8"
    chosen = yaml.safe_load((plan_dir / "plan.yaml").read_text())["explain"]["notes"]["checkpoint"]["interval_steps"]
    assert chosen > 0 and load_plan_dir(plan_dir).checkpoint_interval == chosen
    # The same interval job.sbatch passes: plain `sbatch job.sbatch` and `dsorch submit` agree.
    assert f"--save-interval {chosen} " in (plan_dir / "job.sbatch").read_text()
    cmd = prepare_submission(plan_dir, None, None, None, None, None, None, planned).job.command()
    assert cmd[cmd.index("--save-interval") + 1] == str(chosen)
    given = prepare_submission(plan_dir, None, None, None, None, None, None, planned, save_interval=7).job.command()
    assert given[given.index("--save-interval") + 1] == "7"
    none = prepare_submission(plan_dir, None, None, None, None, None, None, planned, save_interval=0).job.command()
    assert "--save-interval" not in none


def test_a_local_job_listens_on_a_free_port_outside_the_ephemeral_range(tmp_path):
    """submitit's own master port (20000-60000, from the job id) may be one the kernel just gave an
    outgoing connection (EADDRINUSE at run time): the local job gets one outside
    ip_local_port_range, free when it is submitted, and every LocalArray element's (P + i) too."""
    from orchestrator.ports import ephemeral_range
    from orchestrator.run.backends import JobSpec, backend_for
    from orchestrator.run.backends.local import LocalBackend
    from orchestrator.spec.cluster import load_profile

    spec = JobSpec.of(load_profile("local").profile, "tiny")
    backend = backend_for(spec)
    assert isinstance(backend, LocalBackend)
    lo, hi = ephemeral_range()
    for ports in (1, 5):
        setup = backend.executor_for(spec, tmp_path, jobs=[None] * ports).parameters["setup"]
        exports = [line for line in setup if line.startswith("export MASTER_PORT=")]
        assert len(exports) == 1, setup
        port = int(exports[0].split("=")[1])
        assert all(not lo <= p <= hi for p in range(port, port + ports)), (port, lo, hi)


def test_a_port_in_use_is_passed_over_and_none_free_is_a_clear_error(tmp_path):
    import socket

    from orchestrator.errors import JobError
    from orchestrator.ports import local_master_port

    # An ephemeral range that leaves two ports outside it: 10000 and 65535.
    (tmp_path / "range").write_text("10001\t65534\n")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 65535))
        held.listen()
        for _ in range(5):
            assert local_master_port(path=tmp_path / "range") == 10000
        with socket.socket() as other:
            other.bind(("127.0.0.1", 10000))
            other.listen()
            with pytest.raises(JobError, match=r"no free port .* 2 ports outside the ephemeral range 10001-65534"):
                local_master_port(path=tmp_path / "range")
    (tmp_path / "range").write_text("1024 65535\n")
    with pytest.raises(JobError, match="leaves none for the local job's torch.distributed store"):
        local_master_port(path=tmp_path / "range")


def test_what_a_megatron_job_adds_to_launch_sh(runner, in_tmp, monkeypatch):
    """The run directory's checkpoints as --save/--load; --steps as --train-iters with the plan's
    decay kept (--lr-decay-iters), or stretched with --extend-schedule; every iteration logged."""
    from orchestrator.run.submission import prepare_submission

    assert runner.invoke(main, ["plan", "examples/tiny.yaml", "--cluster", "local", "--runtime", "megatron",
                                "--out", "plans/m"]).exit_code == 0
    monkeypatch.setenv("MEGATRON_LM", str(in_tmp / "fakes"))
    r = submit(runner, "plans/m", "--dry-run")
    assert r.exit_code == 2 and "no pretrain_gpt.py there" in r.output  # a local run checks the checkout
    (in_tmp / "fakes").mkdir()
    (in_tmp / "fakes" / "pretrain_gpt.py").write_text("")

    def args(**kw):
        sub = prepare_submission(in_tmp / "plans" / "m", None, None, kw.pop("steps", None), None, in_tmp / "run",
                                 None, in_tmp, **kw)
        assert sub.spec.tasks_per_node == 1 and sub.spec.gpus_per_node == 4  # launch.sh's torchrun starts 4
        return " ".join(sub.job.megatron_args())

    ckpt = in_tmp / "run" / "checkpoints"
    assert args() == f"--save {ckpt} --load {ckpt} --train-iters 30 --log-interval 1"  # tiny: 30 steps
    assert args(steps=10, save_interval=5) == (f"--save {ckpt} --load {ckpt} --train-iters 10 --lr-decay-iters 30 "
                                               f"--save-interval 5 --log-interval 1")
    assert "--train-iters 40 --log-interval" in args(steps=40, extend_schedule=True)


def test_a_slurm_job_exports_one_master_port_outside_the_ephemeral_range():
    """Every task takes the port the batch script exported (submitit's own pick from the job id is
    inside the ephemeral range): outside it, the same for the same allocation, another for the next,
    and a MASTER_PORT the profile or the user set is kept."""
    from orchestrator.ports import ephemeral_range, slurm_master_port_lines
    from orchestrator.run.backends import JobSpec, backend_for
    from orchestrator.spec.cluster import load_profile

    def port(**env) -> int:
        # job.sbatch runs them under `set -u`, also when bash runs it outside SLURM (test_hostile.py).
        script = "\n".join(["set -euo pipefail", *slurm_master_port_lines(), 'echo "$MASTER_PORT"'])
        out = subprocess.run(["bash", "-c", script], env={"PATH": os.environ["PATH"], **env}, capture_output=True,
                             text=True, check=True).stdout
        return int(out)

    lo, hi = ephemeral_range()
    ports = {port(SLURM_JOB_ID=str(j), SLURM_RESTART_COUNT=str(r)) for j in range(100, 140) for r in (0, 1)}
    assert all(0 < p < 65536 and not lo <= p <= hi for p in ports) and len(ports) > 60, sorted(ports)
    assert port(SLURM_JOB_ID="123") == port(SLURM_JOB_ID="123", SLURM_RESTART_COUNT="0")
    assert port(SLURM_JOB_ID="123", SLURM_RESTART_COUNT="1") != port(SLURM_JOB_ID="123")
    assert port(SLURM_JOB_ID="123", MASTER_PORT="29511") == 29511
    assert not lo <= port() <= hi  # no job id: outside SLURM, where nothing else sets one
    spec = JobSpec.of(load_profile("dgx16").profile, "tiny")
    assert backend_for(spec).script(spec, Path("/tmp/folder"), None).count("export MASTER_PORT=") == 1


def test_cancelling_a_local_job_signals_every_process_under_its_shell(tmp_path):
    """submitit starts the local controller under `sh -c "SETUP && python ..."` (the job id is the
    shell's pid), and the ranks run below the controller's tasks: `dsorch cancel` must reach a
    process two levels down, as scancel's SIGTERM reaches every process of a step."""
    import sys
    import time

    from orchestrator.run.backends import backend_for

    marker, ready = tmp_path / "terminated", tmp_path / "ready"
    grandchild = (f"import pathlib, signal, sys, time\n"
                  f"signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path({str(marker)!r}).write_text('yes'), sys.exit(0)))\n"
                  f"pathlib.Path({str(ready)!r}).write_text('')\n"
                  f"time.sleep(60)")
    child = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {grandchild!r}])"
    shell = subprocess.Popen(["sh", "-c", f"true && {sys.executable} -c {shlex.quote(child)}"])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:  # its handler is installed
            time.sleep(0.05)
        backend_for("local").cancel(str(shell.pid))
        shell.wait(timeout=30)
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:  # its handler runs after the shell died
            time.sleep(0.05)
    finally:
        shell.kill()
    assert marker.read_text() == "yes"
