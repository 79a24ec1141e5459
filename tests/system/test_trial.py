"""Trial selection and cost (issue 12, first part): the top K, plus the best of every other family,
priced by the predictions."""

from __future__ import annotations

import pytest

from orchestrator.plan.solver import enumerate_layouts, search
from orchestrator.spec.cluster import load_profile
from orchestrator.spec.model import load_spec
from orchestrator.plan.layout import LAYOUT_FAMILIES
from orchestrator.plan.layout import Pins
from orchestrator.run.trial import select_trials, trial_cost

from ..conftest import EXAMPLES
from .harness import dsorch


@pytest.fixture(scope="module")
def ranked():
    spec, _ = load_spec(EXAMPLES / "llama3-70b.yaml")
    return spec, search(spec.model, spec.training, load_profile("dgx16").profile, "deepspeed", keep=100_000).ranked


def test_top_k_then_the_best_of_every_other_family(ranked):
    spec, layouts = ranked
    picks = select_trials(layouts, 3)
    assert [p.scored for p in picks[:3]] == layouts[:3]
    families = [p.family for p in picks]
    present = {s.layout.family for s in layouts}
    assert set(families) == present  # every family the search found is measured once at least
    extra = picks[3:]
    assert len({p.family for p in extra}) == len(extra)  # one per family beyond the top K
    for p in extra:
        first = next(i for i, s in enumerate(layouts) if s.layout.family == p.family)
        assert p.scored is layouts[first] and p.family not in families[:3]
        assert p.why == f"best {p.family} layout (rank {first + 1})"
    assert len({p.scored.layout for p in picks}) == len(picks)
    assert set(families) <= set(LAYOUT_FAMILIES)
    assert select_trials(layouts, 3) == picks  # deterministic


def test_pins_reproduce_the_layout_exactly(ranked):
    spec, layouts = ranked
    profile = load_profile("dgx16").profile
    for p in select_trials(layouts, 2):
        c, _ = enumerate_layouts(spec.model, spec.training, profile, "deepspeed", Pins.of(p.scored.layout))
        assert len(c) == 1 and int(c.tp[0]) == p.scored.layout.tp and int(c.micro_batch_size[0]) == p.scored.layout.micro_batch_size


def test_cost_is_the_predicted_gpu_hours(ranked):
    _, layouts = ranked
    picks = select_trials(layouts, 3)
    cost = trial_cost(picks, steps=20, world_size=128)
    expected = sum(20 * p.scored.step_time_s for p in picks)
    assert cost.seconds == pytest.approx(expected) and cost.gpu_hours == pytest.approx(expected * 128 / 3600)


@pytest.mark.parametrize("state, log, cause", [
    ("FAILED", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)", "oom"),
    ("FAILED", "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", "oom"),
    ("TIMEOUT", "slurmstepd: error: *** JOB 12 ON n1 CANCELLED AT 2026-12-01T05:00:00 DUE TO TIME LIMIT ***", "timeout"),
    ("FAILED", "ValueError: bad value", "error"),
    ("", "", "error"),
    ("CANCELLED by 0", "", "cancelled"),
])
def test_failures_are_classified(state, log, cause):
    from orchestrator.run.trial import classify_failure

    assert classify_failure(state, log) == cause


def test_a_trial_is_measured_from_its_run_directory(tmp_path, runner, monkeypatch):
    """A COMPLETED trial's run directory (metrics.jsonl) gives its steady step time, as calibrate
    reads it; any other end is a failure with its cause, keeping the peak it recorded."""
    import json

    from orchestrator.cli.main import main
    from orchestrator.run.trial import TrialPick, entry_of, measure, trial_dir_name

    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(EXAMPLES)
    spec, _ = load_spec(EXAMPLES / "tiny.yaml")
    best = search(spec.model, spec.training, load_profile("local").profile, "deepspeed").best
    pick = TrialPick(best, best.layout.family, "rank 1 by prediction")
    entry = entry_of(0, pick, "123_0")
    plan_dir = tmp_path / trial_dir_name(0, pick)
    r = runner.invoke(main, ["plan", "examples/tiny.yaml", "--cluster", "local", "--out", str(plan_dir)])
    assert r.exit_code == 0, r.output
    run = plan_dir / "run"
    run.mkdir()
    lines = [{"step": i, "loss": 1.0, "step_time_s": 2.0 if i < 2 else 0.25, "peak_mem_gib": 0.5,
              "mem_kind": "cpu_peak_rss"} for i in range(10)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = measure(entry, plan_dir, run, "COMPLETED")
    assert res.failure is None and res.measured_step_s == 0.25 and res.peak_mem_gib == 0.5
    assert res.tokens_per_s == pytest.approx(16 * 64 / 0.25)
    from orchestrator.costmodel.flops import model_flops_per_step

    assert res.mfu == pytest.approx(model_flops_per_step(spec.model, 64, 16) / 0.25 / 4 / 0.05e12)
    assert res.error == pytest.approx(entry.predicted_step_s / 0.25 - 1)
    oom = measure(entry, plan_dir, run, "FAILED", "orchestrator.train: out of memory (CPU stand-in for a GPU's "
                                                   "memory limit): the busiest rank's peak ...")
    assert oom.failure == "oom" and oom.measured_step_s is None and oom.peak_mem_gib == 0.5
    failed = measure(entry, plan_dir, tmp_path / "nothing", "FAILED", "torch.OutOfMemoryError: CUDA out of memory.")
    assert failed.failure == "oom" and failed.measured_step_s is None and failed.error is None
    assert measure(entry, plan_dir, run, "TIMEOUT", "").failure == "timeout"
    assert entry.dir == f"01-{pick.family}" and entry.job_id == "123_0"


def test_a_measurement_overrules_the_memory_model_for_its_layout():
    """search(measured_fit=...): a layout predicted not to fit but measured to run is in, one that
    ran out of memory is out, whatever the model predicts."""
    from orchestrator.plan.layout import Layout

    spec, _ = load_spec(EXAMPLES / "tiny.yaml")
    profile = load_profile("local").profile
    res = search(spec.model, spec.training, profile, "deepspeed", keep=100_000)
    best = res.ranked[0].layout
    small = profile.model_copy(update={"gpu": profile.gpu.model_copy(update={"memory_gib": 0.3})})
    assert search(spec.model, spec.training, small, "deepspeed").best is None  # the model: nothing fits
    rescued = search(spec.model, spec.training, small, "deepspeed", measured_fit={best: True})
    assert [s.layout for s in rescued.ranked] == [best] and rescued.ranked[0].fits
    out = search(spec.model, spec.training, profile, "deepspeed", keep=100_000, measured_fit={best: False})
    assert best not in [s.layout for s in out.ranked] and len(out.ranked) == len(res.ranked) - 1
    absent = Layout(tp=3, pp=1, dp=1, vpp=1, zero_stage=0, micro_batch_size=1, grad_accum_steps=16, recompute="none",
                    sequence_parallel=False)
    assert search(spec.model, spec.training, profile, "deepspeed", keep=100_000,
                  measured_fit={absent: True}).feasible == res.feasible  # not a candidate: nothing changes


def test_every_trial_is_an_ordinary_plan_directory(tmp_path):
    """The plan directories of the picks: each is exactly its layout, validates, and is deterministic."""
    from orchestrator.plandir.reader import load_plan_dir
    from orchestrator.run.trial import trial_plans
    from orchestrator.validate.plan_dir import validate_path
    from orchestrator.plandir.writer import write_plan_dir

    spec, loaded_spec = load_spec(EXAMPLES / "tiny.yaml")
    loaded = load_profile("local")
    ranked = search(spec.model, spec.training, loaded.profile, "deepspeed", keep=10_000).ranked
    picks = select_trials(ranked, 2)
    plans = trial_plans(spec, EXAMPLES / "tiny.yaml", loaded_spec.sha256, loaded, "deepspeed", picks, tmp_path / "t")
    assert [d.name for d, _ in plans] == [f"{i + 1:02d}-{p.family}" for i, p in enumerate(picks)]
    for (d, files), pick in zip(plans, picks):
        write_plan_dir(d, files)
        assert validate_path(d) == []
        assert load_plan_dir(d).layout == pick.scored.layout
        assert load_plan_dir(d).spec == spec
    again = trial_plans(spec, EXAMPLES / "tiny.yaml", loaded_spec.sha256, loaded, "deepspeed", picks, tmp_path / "t")
    assert [f for _, f in again] == [f for _, f in plans]


def _dsorch(cwd, *args):
    return dsorch(cwd, *args, check=False)  # each call's exit code is the test's to check


def test_trial_on_the_local_executor_measures_calibrates_and_replans(tmp_path):
    """One command, --cluster local: the trials run in turn as one LocalArray, each is measured,
    the profile calibrated from them (profiles/local-measured.yaml, extending local), the spec
    re-planned with it and the winner written with the trials as evidence."""
    import json

    import yaml

    from orchestrator.plandir.reader import load_plan_dir
    from orchestrator.validate.plan_dir import validate_path

    (tmp_path / "examples").symlink_to(EXAMPLES)
    dry = _dsorch(tmp_path, "trial", "examples/tiny.yaml", "--cluster", "local", "--top", "1", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "GPU-hours of predicted steps" in dry.stdout and sorted(p.name for p in tmp_path.iterdir()) == ["examples"]
    r = _dsorch(tmp_path, "trial", "examples/tiny.yaml", "--cluster", "local", "--top", "1", "--steps", "6", "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    trial_dir = tmp_path / "trials" / "tiny-local"
    manifest = yaml.safe_load((trial_dir / "trial.yaml").read_text())
    n = len(manifest["trials"])
    assert n >= 3 and len({t["family"] for t in manifest["trials"]}) == n
    pid = manifest["trials"][0]["job_id"].split("_")[0]
    assert [t["job_id"] for t in manifest["trials"]] == [f"{pid}_{i}" for i in range(n)]  # one local array
    rows = json.loads(_dsorch(tmp_path, "status", "--json").stdout)
    assert [(row["job_id"], row["state"], row["last_step"]) for row in rows] == \
        [(f"{pid}_{i}", "COMPLETED", 6) for i in range(n)]
    # One element at a time: each started after the previous one's last step.
    starts = [json.loads((trial_dir / t["dir"] / "run" / "starts.jsonl").read_text().splitlines()[0])["time"]
              for t in manifest["trials"]]
    ends = [(trial_dir / t["dir"] / "run" / "metrics.jsonl").stat().st_mtime for t in manifest["trials"]]
    assert all(starts[i + 1] >= ends[i] - 0.5 for i in range(n - 1)), (starts, ends)
    assert "predicted s" in r.stdout and "measured s" in r.stdout
    profile = yaml.safe_load((tmp_path / "profiles" / "local-measured.yaml").read_text())
    assert profile["extends"] == "local" and profile["name"] == "local-measured"
    winner = tmp_path / "plans" / "tiny-local-measured"
    assert validate_path(winner) == []
    pd = load_plan_dir(winner)
    assert pd.doc.inputs.cluster_profile.name == "local-measured"
    ev = pd.doc.evidence
    assert [m["trial"] for m in ev["measured"]] == [t["dir"] for t in manifest["trials"]]
    assert all(m["outcome"] == "ok" and m["measured_step_s"] > 0 for m in ev["measured"])
    assert ev["chosen_layout_measured"] == (pd.layout.short() in [t["layout"] for t in manifest["trials"]])
    results = yaml.safe_load((trial_dir / "results.yaml").read_text())
    assert results["winner"]["layout"] == pd.layout.short()
    # --collect again: the same measurements give the same files, byte for byte.
    before = {p.name: p.read_bytes() for p in winner.iterdir()}
    again = _dsorch(tmp_path, "trial", "--collect", "trials/tiny-local")
    assert again.returncode == 0, again.stderr
    assert {p.name: p.read_bytes() for p in winner.iterdir()} == before
    st = _dsorch(tmp_path, "trial", "--status", "trials/tiny-local")
    assert st.returncode == 0 and f"all {n} trials ended" in st.stdout
    # The directory holds trials now: a second start into it is refused, and nothing is submitted.
    refused = _dsorch(tmp_path, "trial", "examples/tiny.yaml", "--cluster", "local", "--top", "1")
    assert refused.returncode != 0 and "already holds trials" in refused.stderr and "Traceback" not in refused.stderr
    assert len(json.loads(_dsorch(tmp_path, "status", "--json").stdout)) == n


def test_trial_input_errors_are_one_paragraph(tmp_path):
    (tmp_path / "examples").symlink_to(EXAMPLES)
    for args, message in [
        (["--status", "nowhere"], "nowhere is not a trial directory"),
        (["--status", "--collect", "x"], "pass one of them"),
        (["examples/tiny.yaml", "--cluster", "locl"], "unknown cluster profile 'locl'"),
        (["--collect", "x", "--cluster", "local"], "--cluster belongs to starting trials"),
        (["examples/tiny.yaml", "--cluster", "local", "--name", "../evil"], "--name '../evil': a profile name"),
    ]:
        r = _dsorch(tmp_path, "trial", *args)
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
