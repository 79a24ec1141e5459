"""The experiment repository (orchestrator/cli/project.py) as a user meets it: `dsorch init`,
dsorch.yaml found from any subdirectory, defaults with their origin in every message, `dsorch plan
SPEC` and `dsorch submit --cluster NAME` exactly as the README and docs/tutorials/first-plan.md write
them, and every command that needs no SLURM working on a machine without it."""

from __future__ import annotations

import re

import pytest

from orchestrator.cli.main import main


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
