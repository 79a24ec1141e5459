"""`dsorch plan --check` (orchestrator/cli/check.py): spec files and plan directories re-planned from
what they recorded, compared file by file and picture by picture; what changed in the inputs is
named, and what cannot be re-planned says why."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ..conftest import PROFILES
from .test_report import _doc, run


def test_check_names_the_profile_fields_that_changed_and_the_new_best(runner, in_tmp):
    prof = in_tmp / "prof"
    prof.mkdir()
    shipped = (Path(__file__).parents[2] / "cluster_profiles" / "dgx16.yaml").read_text()
    (prof / "dgx16.yaml").write_text(shipped)
    args = ["plan", "examples/llama3-70b.yaml", "--cluster", "dgx16", "--profiles-dir", prof, "--out", in_tmp / "p"]
    assert run(runner, *args).exit_code == 0
    before = _doc(in_tmp / "p")["layout"]
    (prof / "dgx16.yaml").write_text(shipped.replace("memory_gib: 80", "memory_gib: 96"))
    r = run(runner, *args, "--check")
    assert r.exit_code == 1
    assert "the cluster profile dgx16 changed since this plan was made: gpu.memory_gib 80 -> 96." in r.output
    assert run(runner, *args).exit_code == 0
    after = _doc(in_tmp / "p")["layout"]
    if after != before:
        from orchestrator.plan.layout import Layout

        assert f"the best layout now: {Layout(**after).short()}" in r.output
    else:
        assert "the best layout is unchanged" in r.output


def test_check_compares_the_pictures_when_the_plan_directory_has_plots(runner, in_tmp):
    out = in_tmp / "p"
    args = ["plan", "examples/tiny.yaml", "--cluster", "local", "--out", out]
    assert run(runner, *args, "--plot").exit_code == 0
    r = run(runner, *args, "--check")
    assert r.exit_code == 0 and "up to date (9 files)" in r.output, r.output  # 6 files and 3 pictures
    old = {p.name: p.read_text() for p in (out / "plots").iterdir()}
    # Re-planned with another layout: `plan` redraws the pictures already there (so that they do not
    # show the plan before), and --check agrees.
    assert run(runner, *args, "--tp", "2").exit_code == 0
    assert (out / "plots" / "memory.svg").read_text() != old["memory.svg"]
    assert run(runner, *args, "--tp", "2", "--check").exit_code == 0
    # The pictures of the plan before, committed beside the new plan: stale, named, no SVG dumped.
    for name, text in old.items():
        (out / "plots" / name).write_text(text)
    r = run(runner, *args, "--tp", "2", "--check")
    assert r.exit_code == 1
    for name in ("memory.svg", "time.svg", "schedule.svg"):
        assert f"plots/{name} differs from the picture of the regenerated plan" in r.output
    assert "<svg" not in r.output and "plan.yaml" not in r.stdout
    (out / "plots" / "time.svg").unlink()
    assert "plots/time.svg is missing from the picture" in run(runner, *args, "--tp", "2", "--check").output
    # The measured runs' picture depends on runs, not on the plan: not compared. No plots/: no pictures.
    run(runner, "plot", out)
    (out / "plots" / "steps.svg").write_text("<svg/>\n")
    assert run(runner, *args, "--tp", "2", "--check").exit_code == 0
    shutil.rmtree(out / "plots")
    assert "up to date (6 files)" in run(runner, *args, "--tp", "2", "--check").output


def test_check_replans_plan_directories_from_what_they_recorded(runner, in_tmp, monkeypatch):
    plans = in_tmp / "plans"
    # The local profile's hardware as a SLURM cluster's: the local executor runs one node only.
    (in_tmp / "profiles").mkdir()
    (in_tmp / "profiles" / "cpus.yaml").write_text("extends: local\nexecutor: slurm\n")
    monkeypatch.setenv("DSORCH_PROFILES_DIR", str(in_tmp / "profiles"))
    made = {
        "default": ["examples/tiny.yaml", "--cluster", "local"],
        # every recorded input away from its default: nodes, GPUs per node, runtime, pins, margin, --top
        "resized": ["examples/tiny.yaml", "--cluster", "cpus", "--nodes", "2", "--gpus-per-node", "2",
                    "--runtime", "megatron", "--tp", "2", "--no-sp", "--memory-margin", "1", "--top", "12"],
    }
    for name, args in made.items():
        assert run(runner, "plan", *args, "--out", plans / name, "--plot").exit_code == 0
    r = run(runner, "plan", "--check", plans / "default", plans / "resized")
    assert r.exit_code == 0, r.output
    assert "plans/default: up to date (9 files)." in r.output and "plans/resized: up to date (8 files)." in r.output
    # The spec is found relative to the plan directory, from anywhere; a SPEC may come along.
    (in_tmp / "sub").mkdir()
    monkeypatch.chdir(in_tmp / "sub")
    r = run(runner, "plan", "--check", "../plans/resized/", "../examples/tiny.yaml", "--cluster", "local", "--out",
            "../plans/default")
    assert r.exit_code == 0, r.output
    monkeypatch.chdir(in_tmp)
    # Stale: the diff, which directory, and the command that updates it.
    (plans / "resized" / "launch.sh").write_text("#!/bin/sh\n")
    r = run(runner, "plan", "--check", "plans/default", "plans/resized")
    assert r.exit_code == 1
    assert "+++ plans/resized/launch.sh (regenerated)" in r.stdout
    assert ("plans/resized differs from what dsorch 0.1.0 generates for its recorded inputs; run `dsorch plan "
            "plans/resized` to update it.") in r.stderr
    assert "1 of 2 stale: plans/resized" in r.stderr
    # That command: the plan directory planned again in place, from its record.
    assert run(runner, "plan", plans / "resized").exit_code == 0
    assert run(runner, "plan", "--check", plans / "resized").exit_code == 0


def test_check_of_a_plan_directory_reports_a_changed_profile(runner, in_tmp, monkeypatch):
    """The profile is looked up by name as `--cluster` would; what changed in it since is the report."""
    prof = in_tmp / "prof"
    prof.mkdir()
    # As a SLURM cluster's profile, which may grow: the local executor runs one node only.
    shipped = (PROFILES / "local.yaml").read_text().replace("executor: local", "executor: slurm")
    (prof / "local.yaml").write_text(shipped)
    monkeypatch.setenv("DSORCH_PROFILES_DIR", str(prof))
    for name, extra in (("follows", []), ("pinned", ["--nodes", "1"])):
        assert run(runner, "plan", "examples/tiny.yaml", "--cluster", "local", "--out", in_tmp / name,
                   *extra).exit_code == 0
    assert run(runner, "plan", "--check", in_tmp / "follows", in_tmp / "pinned").exit_code == 0
    # The cluster grows: a plan made without --nodes follows the profile, one made with it keeps its count.
    (prof / "local.yaml").write_text(shipped.replace("nodes: 1", "nodes: 2"))
    r = run(runner, "plan", "--check", in_tmp / "follows")
    assert r.exit_code == 1
    assert "the cluster profile local changed since this plan was made: nodes 1 -> 2." in r.stderr
    assert "-  nodes: 1\n+  nodes: 2\n" in r.stdout
    r = run(runner, "plan", "--check", in_tmp / "pinned")
    assert r.exit_code == 1 and "world_size" not in r.stdout  # still 1 node: only the profile's hash differs
    assert "changed since this plan was made: only what --nodes/--gpus-per-node override here" in r.stderr
    # Without its profiles directory the name finds the shipped profile: said so, with the fix.
    monkeypatch.delenv("DSORCH_PROFILES_DIR")
    (prof / "local.yaml").write_text(shipped.replace("memory_gib: 4", "memory_gib: 6"))
    assert run(runner, "plan", "--check", in_tmp / "follows", "--profiles-dir", prof).exit_code == 1
    r = run(runner, "plan", "--check", in_tmp / "pinned")
    assert "the cluster profile local was a user profile when planned and is a shipped one now" in r.stderr
    assert "--profiles-dir" in r.stderr


@pytest.mark.parametrize("args, message", [
    (["--cluster", "local"], "--cluster: a PLAN_DIR is planned again from the inputs its plan.yaml recorded"),
    (["--tp", "2", "--memory-margin", "1"], "--tp, --memory-margin: a PLAN_DIR is planned again"),
    (["--out", "elsewhere"], "--out: a PLAN_DIR is planned again"),
])
def test_flags_that_set_inputs_are_refused_with_only_plan_directories(runner, in_tmp, args, message):
    assert run(runner, "plan", "examples/tiny.yaml", "--cluster", "local", "--out", "p").exit_code == 0
    for cmd in (["plan", "p", *args], ["plan", "--check", "p", *args]):
        r = run(runner, *cmd)
        assert r.exit_code == 2 and message in r.output, r.output


def test_check_of_plan_directories_that_cannot_be_replanned(runner, in_tmp):
    spec = in_tmp / "tiny.yaml"
    spec.write_text((in_tmp / "examples" / "tiny.yaml").read_text())
    for name in ("moved", "ok", "trial"):
        assert run(runner, "plan", spec if name == "moved" else "examples/tiny.yaml", "--cluster", "local", "--out",
                   in_tmp / name).exit_code == 0
    spec.unlink()
    # plan.yaml is not hash-checked: a `dsorch trial` plan differs only by its evidence section.
    doc = (in_tmp / "trial" / "plan.yaml").read_text()
    (in_tmp / "trial" / "plan.yaml").write_text(doc + "evidence:\n  trials: ../trials\n")
    r = run(runner, "plan", "--check", "moved")
    assert r.exit_code == 2
    assert "moved/plan.yaml records the model spec ../tiny.yaml (relative to the plan directory), and tiny.yaml is " \
           "not a file" in r.output
    r = run(runner, "plan", "--check", "trial")
    assert r.exit_code == 2 and "chosen by `dsorch trial` from measured runs" in r.output
    # Several: each is still checked, and the summary names those that could not be.
    r = run(runner, "plan", "--check", "moved", "ok", "trial", "examples")
    assert r.exit_code == 2
    assert "ok: up to date" in r.stdout
    assert "3 of 4 could not be checked: moved, trial, examples" in r.stderr
    assert "examples has no plan.yaml file, so it is not a plan directory" in r.stderr
    r = run(runner, "plan", "ok", "moved")
    assert r.exit_code == 2 and "plan one at a time; several are for --check" in r.output
    r = run(runner, "plan", "--check", "examples/tiny.yaml", "examples/llama3-8b.yaml", "--cluster", "local", "--out",
            "ok")
    assert r.exit_code == 2 and "--out names one plan directory and 2 SPECs were given" in r.output
