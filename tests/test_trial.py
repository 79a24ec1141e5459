"""Trial selection and cost (issue 12, first part): the top K, plus the best of every other family,
priced by the predictions."""

from __future__ import annotations

import pytest

from orchestrator.solver import enumerate_layouts, search
from orchestrator.specs import load_profile, load_spec
from orchestrator.trial import FAMILIES, family, pins_of, select_trials, trial_cost

from .conftest import EXAMPLES


@pytest.fixture(scope="module")
def ranked():
    spec, _ = load_spec(EXAMPLES / "llama3-70b.yaml")
    return spec, search(spec.model, spec.training, load_profile("dgx16").profile, "deepspeed", keep=100_000).ranked


def test_top_k_then_the_best_of_every_other_family(ranked):
    spec, layouts = ranked
    picks = select_trials(layouts, 3)
    assert [p.scored for p in picks[:3]] == layouts[:3]
    families = [p.family for p in picks]
    present = {family(s.layout) for s in layouts}
    assert set(families) == present  # every family the search found is measured once at least
    extra = picks[3:]
    assert len({p.family for p in extra}) == len(extra)  # one per family beyond the top K
    for p in extra:
        first = next(i for i, s in enumerate(layouts) if family(s.layout) == p.family)
        assert p.scored is layouts[first] and p.family not in families[:3]
        assert p.why == f"best {p.family} layout (rank {first + 1})"
    assert len({p.scored.layout for p in picks}) == len(picks)
    assert set(families) <= set(FAMILIES)
    assert select_trials(layouts, 3) == picks  # deterministic


def test_pins_reproduce_the_layout_exactly(ranked):
    spec, layouts = ranked
    profile = load_profile("dgx16").profile
    for p in select_trials(layouts, 2):
        c, _ = enumerate_layouts(spec.model, spec.training, profile, "deepspeed", pins_of(p.scored.layout))
        assert len(c) == 1 and int(c.tp[0]) == p.scored.layout.tp and int(c.mbs[0]) == p.scored.layout.micro_batch_size


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
])
def test_failures_are_classified(state, log, cause):
    from orchestrator.trial import classify_failure

    assert classify_failure(state, log) == cause


def test_a_trial_is_measured_from_its_run_directory(tmp_path, runner, monkeypatch):
    """The run directory of a trial (metrics.jsonl) gives its steady step time, as calibrate reads it;
    a run with no steps is a failure with its cause."""
    import json

    from orchestrator.cli import main
    from orchestrator.trial import TrialPick, measure, trial_dir_name

    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(EXAMPLES)
    spec, _ = load_spec(EXAMPLES / "tiny.yaml")
    best = search(spec.model, spec.training, load_profile("local").profile, "deepspeed").best
    pick = TrialPick(best, family(best.layout), "rank 1 by prediction")
    plan_dir = tmp_path / trial_dir_name(0, pick)
    r = runner.invoke(main, ["plan", "examples/tiny.yaml", "--cluster", "local", "--out", str(plan_dir)])
    assert r.exit_code == 0, r.output
    run = plan_dir / "run"
    run.mkdir()
    lines = [{"step": i, "loss": 1.0, "step_time_s": 2.0 if i < 2 else 0.25, "peak_mem_gib": 0.5,
              "mem_kind": "cpu_peak_rss"} for i in range(10)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = measure(pick, plan_dir, run)
    assert res.failure is None and res.measured_step_s == 0.25 and res.peak_mem_gib == 0.5
    assert res.error == pytest.approx(best.step_time_s / 0.25 - 1)
    failed = measure(pick, plan_dir, tmp_path / "nothing", "FAILED", "torch.OutOfMemoryError: CUDA out of memory.")
    assert failed.failure == "oom" and failed.measured_step_s is None and failed.error is None
    assert trial_dir_name(0, pick) == f"01-{pick.family}"


def test_every_trial_is_an_ordinary_plan_directory(tmp_path):
    """The plan directories of the picks: each is exactly its layout, validates, and is deterministic."""
    from orchestrator.plandir import load_plan_dir
    from orchestrator.trial import trial_plans
    from orchestrator.validate.plan_dir import validate_path
    from orchestrator.writer import write_plan_dir

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
