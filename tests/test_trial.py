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
