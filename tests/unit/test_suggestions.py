"""The does-not-fit explanation (plan/make.py ``_nothing_fits``, plan/solver.py ``runnable`` and
``minimum_nodes``) names only layouts a user could run, and node counts it really found (issue 37:
"closest to fitting: tp4+sp cp32 ..." for a short sequence; "needs at least 2048 nodes")."""

from __future__ import annotations

import pytest

from orchestrator.plan import make, solver
from orchestrator.plan.layout import Pins
from orchestrator.plan.solver import SUGGESTED_MIN_CP_TOKENS, NodeCount, minimum_nodes, runnable, search
from orchestrator.runtimes import MEGATRON
from orchestrator.spec.cluster import load_profile
from orchestrator.spec.model import load_spec

from ..conftest import EXAMPLES


def _inputs(name="llama3-405b", profile="gb200-nvl72", nodes=32):
    spec, _ = load_spec(EXAMPLES / f"{name}.yaml")
    return spec, load_profile(profile).profile.resized(nodes=nodes)


def test_the_closest_layout_is_one_a_user_would_run():
    # Before: tp4+sp cp32 pp1 dp1 (256 tokens of an 8,192-token sequence per rank), 606 GiB per GPU.
    spec, profile = _inputs()
    res = search(spec.model, spec.training, profile, "megatron", Pins(tp=4, pp=1))
    assert res.best is None and res.closest
    for s in res.closest:
        L = s.layout
        assert spec.training.seq_length // L.cp >= SUGGESTED_MIN_CP_TOKENS, L.short()
        assert L.pp == 1 or L.grad_accum_steps >= L.pp, L.short()
    # a pinned cp is the user's: the closest layout keeps it
    pinned = search(spec.model, spec.training, profile, "megatron", Pins(tp=4, pp=1, cp=32))
    assert pinned.closest and all(s.layout.cp == 32 for s in pinned.closest)


def test_runnable_judges_only_what_is_not_pinned():
    spec, profile = _inputs()
    res = search(spec.model, spec.training, profile, "megatron", Pins(tp=4, pp=1, cp=32), memory_margin_gib=-1e6)
    L = res.best.layout
    assert not runnable(L, spec.training) and runnable(L, spec.training, Pins(cp=32))


def _scored(spec, profile):
    return search(spec.model, spec.training, profile, "megatron", memory_margin_gib=-1e6, keep=1).best


def test_a_count_past_the_contiguous_scan_is_not_called_the_least(monkeypatch):
    """Past its first 32 counts the scan doubles: a count found there fits, but a smaller one may too."""
    spec, profile = _inputs("llama3-8b", "dgx16", 1)
    real = solver.search
    fits_from = 64

    def search_stub(model, training, prof, runtime, pins, **kw):
        res = real(model, training, prof, runtime, pins, **kw)
        return res if prof.nodes >= fits_from else solver.SearchResult([], 1, 0, 1, [], res.capacity_gib)

    monkeypatch.setattr(solver, "search", search_stub)
    found = minimum_nodes(spec.model, spec.training, profile, "megatron")
    assert found is not None and found.nodes == 64 and not found.least
    assert found.searched == tuple(range(2, 34))  # then 64, the first doubling past them
    fits_from = 20
    found = minimum_nodes(spec.model, spec.training, profile, "megatron")
    assert found is not None and found.nodes == 20 and found.least


@pytest.mark.parametrize(
    ("more", "words"),
    [
        (lambda best: NodeCount(12, best, True, tuple(range(2, 12))), "It needs at least 12 nodes of dgx16"),
        (
            lambda best: NodeCount(64, best, False, tuple(range(2, 34))),
            "It fits on 64 nodes of dgx16 (rerun with --nodes 64)",
        ),
        (lambda best: None, "No node count up to 64 nodes of dgx16 makes it fit with tp=8 pinned: drop some pins"),
    ],
)
def test_the_node_count_sentence_says_what_was_searched(monkeypatch, more, words):
    spec, profile = _inputs("llama3-405b", "dgx16", 1)
    pins = Pins(tp=8)
    res = search(spec.model, spec.training, profile, "megatron", pins)
    assert res.best is None
    best = _scored(spec, profile.resized(nodes=16))
    monkeypatch.setattr(make, "minimum_nodes", lambda *a, **k: more(best))
    text = make._nothing_fits(spec, profile, MEGATRON, pins, res, 0.0)
    assert words in text, text
    if "fits on 64" in words:
        assert "2 to 33 nodes do not, and the counts between were not searched" in text
