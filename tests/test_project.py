"""The experiment repository as a user meets it: `dsorch init`, dsorch.yaml found from any
subdirectory, defaults with their origin in every message, `dsorch plan SPEC` and `dsorch submit
--cluster NAME` exactly as the README writes them, and every command that needs no SLURM working
on a machine without it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli.main import main

from .conftest import ROOT

# SLURM's client commands and daemons, and munge's: what a machine without SLURM lacks.
_SLURM_TOOL = re.compile(r"s(batch|run|control|acct|cancel|queue|info|alloc|acctmgr|attach|bcast|crontab|diag|prio"
                         r"|report|share|stat|trigger|view)|slurm.*|munge.*|unmunge")


def path_without_slurm(tmp_path: Path) -> str:
    """A PATH with every program of the current PATH except SLURM's and munge's: one directory of
    symlinks, so that /usr/bin's python and coreutils stay while its sbatch goes."""
    bin_dir = tmp_path / "no-slurm-bin"
    bin_dir.mkdir()
    dirs = [str(Path(sys.executable).parent), *os.environ.get("PATH", "").split(os.pathsep)]
    for d in dirs + ["/usr/sbin", "/sbin"]:
        if not d or not os.path.isdir(d):
            continue
        for entry in os.scandir(d):
            link = bin_dir / entry.name
            try:
                if _SLURM_TOOL.fullmatch(entry.name) or link.is_symlink():
                    continue
                if entry.is_file() and os.access(entry.path, os.X_OK):
                    link.symlink_to(entry.path)
            except OSError:  # a dangling or looping link (Debian's /usr/bin/X11 can loop): not a program
                continue
    path = str(bin_dir)
    for tool in ("sbatch", "srun", "sacct", "scancel", "scontrol"):
        assert shutil.which(tool, path=path) is None, tool
    return path


@pytest.fixture
def exp(in_tmp, runner, monkeypatch):
    """An experiment directory made with `dsorch init --cluster dgx16`."""
    monkeypatch.delenv("DSORCH_CLUSTER", raising=False)
    r = runner.invoke(main, ["init", "--cluster", "dgx16"])
    assert r.exit_code == 0, r.output
    return in_tmp


def test_init_writes_a_config_and_refuses_to_overwrite(in_tmp, runner):
    r = runner.invoke(main, ["init", "--cluster", "dgx16"])
    assert r.exit_code == 0, r.output
    text = (in_tmp / "dsorch.yaml").read_text()
    assert "cluster: dgx16" in text and "plans_dir: plans" in text and "runs_dir: runs" in text
    r = runner.invoke(main, ["init", "--cluster", "local"])
    assert r.exit_code == 2 and "dsorch.yaml exists" in r.output and "--force" in r.output
    assert (in_tmp / "dsorch.yaml").read_text() == text
    assert runner.invoke(main, ["init", "--cluster", "local", "--force"]).exit_code == 0
    assert "cluster: local" in (in_tmp / "dsorch.yaml").read_text()


@pytest.mark.parametrize("args, message", [
    (["--cluster", "dgx61"], "unknown cluster profile 'dgx61'. Did you mean 'dgx16'?"),
    (["--profiles-dir", "nowhere"], "--profiles-dir nowhere:"),
    (["--plans-dir", "/abs/plans"], "give a path inside"),
    (["--runs-dir", "../runs"], "give a path inside"),
])
def test_init_refuses_bad_settings_and_writes_nothing(in_tmp, runner, args, message):
    r = runner.invoke(main, ["init", *args])
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split()) and "Traceback" not in r.output
    assert not (in_tmp / "dsorch.yaml").exists()


def test_plan_with_the_default_cluster_writes_the_default_directory(exp, runner):
    r = runner.invoke(main, ["plan", "examples/llama3-8b.yaml", "--nodes", "2"])
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert re.search(r"runtime deepspeed \(cluster from \S*dsorch.yaml:\d+ \(cluster\)\)", out), out
    assert "wrote plans/llama3-8b-dgx16-2n/" in out and "the default plan directory" in out
    assert (exp / "plans" / "llama3-8b-dgx16-2n" / "job.sbatch").is_file()
    # The default directory is where --check looks, too.
    assert runner.invoke(main, ["plan", "examples/llama3-8b.yaml", "--nodes", "2", "--check"]).exit_code == 0
    # Another runtime gets its own directory.
    assert runner.invoke(main, ["plan", "examples/llama3-8b.yaml", "--nodes", "2", "--runtime", "megatron"]).exit_code == 0
    assert (exp / "plans" / "llama3-8b-dgx16-2n-megatron" / "megatron_args.txt").is_file()


def test_no_write_and_json_leave_no_files(exp, runner):
    r = runner.invoke(main, ["plan", "examples/llama3-8b.yaml", "--nodes", "2", "--no-write"])
    assert r.exit_code == 0 and "wrote" not in r.output
    assert not (exp / "plans").exists()


def test_the_config_is_found_from_a_subdirectory(exp, runner, monkeypatch):
    sub = exp / "notes" / "deep"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    r = runner.invoke(main, ["plan", "../../examples/llama3-8b.yaml", "--nodes", "2"])
    assert r.exit_code == 0, r.output
    assert (exp / "plans" / "llama3-8b-dgx16-2n" / "plan.yaml").is_file()
    assert not (sub / "plans").exists()
    # plan.yaml records the spec relative to the plan directory, wherever dsorch ran from.
    assert "path: ../../examples/llama3-8b.yaml" in (exp / "plans" / "llama3-8b-dgx16-2n" / "plan.yaml").read_text()
    # The registry is the experiment directory's, not the subdirectory's.
    assert runner.invoke(main, ["status"]).exit_code == 0
    assert not (sub / ".dsorch").exists()


def test_flag_beats_environment_beats_config(exp, runner, monkeypatch):
    monkeypatch.setenv("DSORCH_CLUSTER", "hgx-h200-ndr")
    r = runner.invoke(main, ["plan", "examples/llama3-8b.yaml", "--nodes", "2", "--no-write"])
    assert r.exit_code == 0 and "hgx-h200-ndr:" in r.output and "cluster from $DSORCH_CLUSTER" in r.output
    r = runner.invoke(main, ["plan", "examples/llama3-8b.yaml", "--nodes", "2", "--no-write", "--cluster", "dgx16"])
    assert r.exit_code == 0 and "dgx16:" in r.output and "cluster from" not in r.output


def test_errors_say_which_default_was_used_and_from_where(exp, runner, monkeypatch):
    (exp / "dsorch.yaml").write_text("plans_dir: plans\ncluster: dgx61\n")
    r = runner.invoke(main, ["plan", "examples/llama3-8b.yaml"])
    assert r.exit_code == 2
    assert re.search(r"cluster 'dgx61' \(from \S*dsorch.yaml:2 \(cluster\)\): unknown cluster profile 'dgx61'",
                     " ".join(r.output.split())), r.output
    monkeypatch.setenv("DSORCH_CLUSTER", "nope")
    r = runner.invoke(main, ["plan", "examples/llama3-8b.yaml"])
    assert r.exit_code == 2 and "cluster 'nope' (from $DSORCH_CLUSTER)" in r.output


def test_no_cluster_anywhere_says_how_to_give_one(in_tmp, runner, monkeypatch):
    monkeypatch.delenv("DSORCH_CLUSTER", raising=False)
    r = runner.invoke(main, ["plan", "examples/llama3-8b.yaml"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    out = " ".join(r.output.split())
    assert "no cluster given" in out and "--cluster NAME" in out and "dsorch init --cluster NAME" in out


@pytest.mark.parametrize("text, message", [
    ("clusters: dgx16\n", "dsorch.yaml:1: unknown key 'clusters' in the dsorch config; did you mean 'cluster'?"),
    ("cluster: [a, b]\n", "dsorch.yaml:1: key 'cluster'"),
    ("cluster: dgx16\ncluster: local\n", "appears twice"),
    ("cluster: 'unterminated\n", "malformed YAML"),
])
def test_a_broken_config_is_reported_with_file_and_line(in_tmp, runner, text, message):
    (in_tmp / "dsorch.yaml").write_text(text)
    for args in (["plan", "examples/llama3-8b.yaml"], ["status"], ["submit", "--dry-run"], ["profiles"]):
        r = runner.invoke(main, args)
        assert r.exit_code == 2, (args, r.output)
        assert message in " ".join(r.output.split()) and "Traceback" not in r.output, (args, r.output)


def test_an_empty_config_means_all_defaults(in_tmp, runner):
    (in_tmp / "dsorch.yaml").write_text("# nothing yet\n")
    r = runner.invoke(main, ["plan", "examples/llama3-8b.yaml", "--cluster", "dgx16", "--nodes", "2"])
    assert r.exit_code == 0, r.output
    assert (in_tmp / "plans" / "llama3-8b-dgx16-2n").is_dir()


def test_profiles_dir_from_the_config_is_relative_to_it(in_tmp, runner, monkeypatch):
    monkeypatch.delenv("DSORCH_PROFILES_DIR", raising=False)
    (in_tmp / "profiles").mkdir()
    (in_tmp / "profiles" / "mine.yaml").write_text("extends: dgx16\nnodes: 2\n")
    assert runner.invoke(main, ["init", "--cluster", "mine", "--profiles-dir", "profiles"]).exit_code == 0
    sub = in_tmp / "sub"
    sub.mkdir()
    monkeypatch.chdir(sub)
    r = runner.invoke(main, ["plan", "../examples/llama3-8b.yaml"])
    assert r.exit_code == 0, r.output
    assert "mine: 2 nodes" in r.output
    assert (in_tmp / "plans" / "llama3-8b-mine").is_dir()


def test_submit_finds_the_plan_for_the_cluster(exp, runner, monkeypatch):
    assert runner.invoke(main, ["plan", "examples/llama3-8b.yaml", "--nodes", "2"]).exit_code == 0
    assert runner.invoke(main, ["plan", "examples/tiny.yaml", "--cluster", "local"]).exit_code == 0
    r = runner.invoke(main, ["submit", "--cluster", "dgx16", "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "plan: plans/llama3-8b-dgx16-2n" in r.output and "#SBATCH --nodes=2" in r.output
    # Without --cluster: the default cluster of dsorch.yaml picks it.
    r = runner.invoke(main, ["submit", "--dry-run"])
    assert r.exit_code == 0 and "plans/llama3-8b-dgx16-2n" in r.output
    # Inside a plan directory, that plan.
    monkeypatch.chdir(exp / "plans" / "tiny-local")
    r = runner.invoke(main, ["submit", "--dry-run"])
    assert r.exit_code == 0 and "LocalExecutor" in r.output


def test_submit_asks_when_the_plan_is_ambiguous_or_missing(exp, runner):
    r = runner.invoke(main, ["submit", "--cluster", "dgx16", "--dry-run"])
    assert r.exit_code == 2 and "has no plan directory" in r.output
    for nodes in ("2", "4"):
        assert runner.invoke(main, ["plan", "examples/llama3-8b.yaml", "--nodes", nodes, "--out",
                                    f"plans/l8-{nodes}"]).exit_code == 0
    r = runner.invoke(main, ["submit", "--cluster", "dgx16", "--dry-run"])
    out = " ".join(r.output.split())
    assert r.exit_code == 2 and "2 plans in plans/ for cluster 'dgx16' (from --cluster); say which" in out, out
    assert "plans/l8-2 (cluster dgx16)" in out and "plans/l8-4 (cluster dgx16)" in out
    r = runner.invoke(main, ["submit", "--cluster", "local", "--dry-run"])
    assert r.exit_code == 2 and "no plan in plans/ for cluster 'local'" in r.output


def _run(cmd, env, cwd, timeout=900):
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_without_slurm_everything_but_submitting_works(tmp_path):
    """A machine with no SLURM binaries: plan, submit --dry-run, validate, status, logs work;
    submitting to a SLURM profile and cancelling a SLURM job say what is missing, exit 2."""
    env = dict(os.environ, PATH=path_without_slurm(tmp_path), DS_ACCELERATOR="cpu")
    env.pop("DSORCH_CLUSTER", None)
    env.pop("DSORCH_PROFILES_DIR", None)
    dsorch = [str(Path(sys.executable).with_name("dsorch"))]
    exp = tmp_path / "exp"
    exp.mkdir()
    assert _run([*dsorch, "init", "--cluster", "dgx16"], env, exp).returncode == 0
    r = _run([*dsorch, "plan", str(ROOT / "examples" / "llama3-8b.yaml"), "--nodes", "2"], env, exp)
    assert r.returncode == 0, r.stderr
    r = _run([*dsorch, "submit", "--dry-run"], env, exp)
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --nodes=2" in r.stdout and "srun --unbuffered" in r.stdout
    assert _run([*dsorch, "validate", "plans/llama3-8b-dgx16-2n"], env, exp).returncode == 0
    r = _run([*dsorch, "submit"], env, exp)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    msg = " ".join(r.stderr.split())
    assert "sbatch and srun are not on PATH" in msg and "--dry-run" in msg and "--cluster local" in msg
    # doctor has no --dry-run, so its message names none.
    r = _run([*dsorch, "doctor", "--nodes", "2"], env, exp)
    msg = " ".join(r.stderr.split())
    assert r.returncode == 2 and "sbatch and srun are not on PATH" in msg and "--dry-run" not in msg, r.stderr
    # A SLURM job recorded elsewhere (the experiment directory copied from a login node).
    from orchestrator.run.registry import Registry, now_utc

    reg = Registry(exp)
    with reg.reserve("plans/llama3-8b-dgx16", False) as (insert, update):
        insert(job_id="4242", executor="slurm", cluster="dgx16", plan_dir="plans/llama3-8b-dgx16", plan_sha256="x",
               submitted_at=now_utc(), state="RUNNING", run_dir=str(exp / "runs" / "r"), log_dir=str(exp / "logs"))
    r = _run([*dsorch, "status", "--json"], env, exp)
    assert r.returncode == 0 and json.loads(r.stdout)[0]["state"] == "RUNNING"
    r = _run([*dsorch, "status"], env, exp)
    assert r.returncode == 0 and "sacct is not on PATH here" in " ".join(r.stdout.split())
    r = _run([*dsorch, "logs", "4242"], env, exp)
    assert r.returncode == 2 and "no log for rank 0" in r.stderr and "Traceback" not in r.stderr
    r = _run([*dsorch, "cancel", "4242"], env, exp)
    assert r.returncode == 2 and "needs scancel, which is not on PATH" in r.stderr and "Traceback" not in r.stderr


def test_quickstart_runs_on_a_machine_without_slurm(tmp_path):
    """The README's first command, verbatim, with SLURM's binaries hidden from PATH."""
    env = {"HOME": os.environ.get("HOME", str(tmp_path)), "PATH": path_without_slurm(tmp_path),
           "DSORCH_QUICKSTART_DIR": str(tmp_path / "quickstart"), "LANG": "C.UTF-8"}
    for key in ("TORCH_EXTENSIONS_DIR", "TMPDIR"):
        if key in os.environ:
            env[key] = os.environ[key]
    r = _run(["bash", str(ROOT / "scripts" / "quickstart.sh")], env, tmp_path)
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert "#SBATCH --nodes=16" in r.stdout
    assert re.search(r"job \d+: COMPLETED at step 30", r.stdout), r.stdout[-2000:]
    assert re.search(r"^step +30 \| loss", r.stdout, re.M)
    assert (tmp_path / "quickstart" / "plans" / "llama3-70b-dgx16" / "job.sbatch").is_file()


def test_check_json_and_no_write_combinations(exp, runner):
    assert runner.invoke(main, ["plan", "examples/llama3-8b.yaml", "--nodes", "2"]).exit_code == 0
    r = runner.invoke(main, ["plan", "examples/llama3-8b.yaml", "--nodes", "2", "--check", "--json"])
    assert r.exit_code == 0 and "up to date" in r.output, r.output
    r = runner.invoke(main, ["plan", "examples/llama3-8b.yaml", "--no-write", "--out", "elsewhere"])
    assert r.exit_code == 2 and "--no-write writes no plan directory and --out names one" in r.output
    assert not (exp / "elsewhere").exists()


def test_resized_plans_get_their_own_directory(exp, runner):
    for extra in ([], ["--nodes", "2"], ["--nodes", "2", "--gpus-per-node", "4"]):
        assert runner.invoke(main, ["plan", "examples/llama3-8b.yaml", *extra]).exit_code == 0
    assert sorted(p.name for p in (exp / "plans").iterdir()) == [
        "llama3-8b-dgx16", "llama3-8b-dgx16-2n", "llama3-8b-dgx16-2n-4g"]


def test_submit_without_plan_dir_considers_only_plans_it_can_run(exp, runner):
    assert runner.invoke(main, ["plan", "examples/llama3-8b.yaml", "--nodes", "2"]).exit_code == 0
    assert runner.invoke(main, ["plan", "examples/llama3-8b.yaml", "--nodes", "2", "--runtime", "megatron"]).exit_code == 0
    r = runner.invoke(main, ["submit", "--dry-run"])
    assert r.exit_code == 0 and "plan: plans/llama3-8b-dgx16-2n\n" in r.output, r.output


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


def test_init_keeps_run_outputs_out_of_git(in_tmp, runner):
    (in_tmp / ".gitignore").write_text("*.pyc\n.dsorch/")  # no final newline
    assert runner.invoke(main, ["init", "--cluster", "dgx16"]).exit_code == 0
    lines = (in_tmp / ".gitignore").read_text().splitlines()
    assert lines[:2] == ["*.pyc", ".dsorch/"] and lines.count(".dsorch/") == 1
    for line in ("/runs/", "/plans/*/run/", "/plans/*/checkpoints/", "/plans/*/slurm-*.out"):
        assert line in lines
    before = (in_tmp / ".gitignore").read_text()
    assert runner.invoke(main, ["init", "--cluster", "dgx16", "--force"]).exit_code == 0
    assert (in_tmp / ".gitignore").read_text() == before  # nothing added twice


def test_a_missing_profiles_dir_is_named_with_its_origin(in_tmp, runner, monkeypatch):
    monkeypatch.delenv("DSORCH_PROFILES_DIR", raising=False)
    (in_tmp / "dsorch.yaml").write_text("cluster: local\nprofiles_dir: nope\n")
    r = runner.invoke(main, ["plan", "examples/tiny.yaml"])
    out = " ".join(r.output.split())
    assert r.exit_code == 2 and re.search(r"profiles directory '\S*nope' \(from \S*dsorch.yaml:2 \(profiles_dir\)\) "
                                          r"does not exist", out), out
