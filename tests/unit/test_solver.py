"""The search (orchestrator/plan/solver.py): it finds the layouts the rules allow and the cost model
ranks first, with every pin kept."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.costmodel.memory import GIB
from orchestrator.plan.layout import AXIS, PINNABLE, TIEBREAK, Pins
from orchestrator.plan.solver import _simplest_first, _simplicity, candidates_of, search
from orchestrator.runtimes import runtime_named
from orchestrator.spec.cluster import load_profile
from orchestrator.spec.model import load_spec
from orchestrator.spec.training import TrainingSpec

from ..conftest import EXAMPLES, PROFILES
from .test_moe_costmodel import DSV3
from .test_partial_recompute import _profile, _spec


def test_mtp_and_dense_leading_layers_split_the_pipeline():
    # 61 layers + 1 MTP module + embedding + loss = 64 slots, 8 per stage at pp 8.
    res = search(
        DSV3,
        TrainingSpec(seq_length=4096, global_batch_size=4096, steps=100, optimizer=dict(warmup_steps=10)),
        load_profile("dgx16").profile.resized(nodes=32),
        "megatron",
        Pins(tp=1, pp=8, vpp=4, ep=32, micro_batch_size=1, recompute="none", zero_stage=1, cp=1),
        memory_margin_gib=-1e6,
        keep=1,
    )
    assert res.best is not None and res.best.layout.short().startswith("tp1 ep32 pp8 vpp4")
    assert np.isfinite(res.best.step_time_s) and res.best.memory_gib["total"] * GIB > 0


def _inputs(name: str, nodes: int = 1):
    spec, _ = load_spec(EXAMPLES / f"{name}.yaml")
    loaded = load_profile("dgx16", PROFILES)
    return spec, loaded, loaded.profile.resized(nodes, None)


def test_tiebreak_orders_every_searched_axis():
    """The simplicity order has one home: every pinnable axis but dp (which follows) is in it."""
    assert set(TIEBREAK) == {a.name for a in PINNABLE} - {"dp"}
    assert all(name in AXIS for name in TIEBREAK)


@pytest.mark.parametrize(("name", "runtime", "nodes"), [("llama3-8b", "deepspeed", 1), ("llama3-70b", "megatron", 16)])
def test_near_tie_resolved_toward_a_simpler_layout(name, runtime, nodes):
    spec, _, profile = _inputs(name, nodes)
    res = search(spec.model, spec.training, profile, runtime, keep=1_000_000)
    nt = res.near_ties
    assert nt is not None and 0 < nt.band < 0.2
    fastest, chosen = nt.fastest, res.best
    assert fastest.step_time_s == min(s.step_time_s for s in res.ranked)
    assert chosen.step_time_s <= fastest.step_time_s * (1 + nt.band)

    # at least as simple on every axis as the fastest (the ZeRO stage in the runtime's order)
    def simplicity(layout, n):
        code = AXIS[n].code(getattr(layout, n))
        return int(runtime_named(runtime).zero_simplicity(code)) if n == "zero_stage" else code

    for n in TIEBREAK:
        assert simplicity(chosen.layout, n) <= simplicity(fastest.layout, n), n
    # every layout within the band is listed, the chosen one apart
    within = [s.layout for s in res.ranked if s.step_time_s <= fastest.step_time_s * (1 + nt.band)]
    assert nt.count == len(within)
    assert {s.layout for s in nt.others} == set(within) - {chosen.layout}


def test_megatron_prefers_the_distributed_optimizer_to_zero0():
    """Issue 37: with a recipe pinned on a GPU where ZeRO-0 fits, Megatron-LM's near-tie went to
    ZeRO-0 as 'simplest' (+33.7 GiB per GPU here); the distributed optimizer is the runtime's
    default, so it is simpler. The deepspeed runtime keeps ZeRO-0 first."""
    spec, _ = load_spec(EXAMPLES / "llama3-8b.yaml")
    profile = load_profile("dgx-b200", PROFILES).profile.resized(1, None)
    pins = Pins(tp=2, pp=1, cp=1, vpp=1, recompute="none", micro_batch_size=1, sequence_parallel=True)
    res = search(spec.model, spec.training, profile, "megatron", pins, keep=10)
    assert {s.layout.zero_stage for s in res.ranked} == {0, 1}  # both fit
    assert res.best is not None and res.best.layout.zero_stage == 1
    assert list(runtime_named("megatron").zero_simplicity([0, 1, 2])) == [1, 0, 2]
    assert list(runtime_named("deepspeed").zero_simplicity([0, 1, 2, 3])) == [0, 1, 2, 3]


def test_pinned_full_recomputation_is_every_layer():
    """Issue 37: ``--recompute full`` also searched partial recomputation (rc=full/N), which is not
    Megatron-LM's full; partial recomputation is its own pin, ``--recompute-layers N``."""
    model, training = _spec()
    profile = _profile()
    pins = dict(tp=8, pp=16, cp=1, vpp=1, micro_batch_size=1, zero_stage=1, sequence_parallel=True)
    full = search(model, training, profile, "megatron", Pins(**pins, recompute="full"), keep=100)
    assert full.ranked and {s.layout.recompute_layers for s in full.ranked} == {0}
    partial = search(
        model, training, profile, "megatron", Pins(**pins, recompute_layers=2), keep=100, memory_margin_gib=-1e6
    )
    assert partial.ranked and {(s.layout.recompute, s.layout.recompute_layers) for s in partial.ranked} == {("full", 2)}


def test_zero_band_keeps_the_fastest_first():
    spec, _, profile = _inputs("llama3-8b")
    layouts = [s.layout for s in search(spec.model, spec.training, profile, "deepspeed", keep=6).ranked]
    cand = candidates_of(spec.model, layouts)
    step = np.array([1.0, 1.001, 1.002, 1.5, 1.6, 1.7])
    keys = _simplicity(cand, runtime_named("deepspeed"))
    order, within = _simplest_first(keys, step, np.arange(6), 0.0)
    assert list(order) == list(range(6)) and len(within) == 0
    # a band covering all: the chosen is no more complex on any axis than the fastest
    order, within = _simplest_first(keys, step, np.arange(6), 1.0)
    first = layouts[int(order[0])]
    assert all(AXIS[n].code(getattr(first, n)) <= AXIS[n].code(getattr(layouts[0], n)) for n in TIEBREAK)
    assert len(within) == 5


def test_the_search_finds_a_partial_layout_between_full_and_none():
    """Meta's degrees: full recomputation fits, none does not; a partial level fits and is faster than full."""
    model, training = _spec()
    profile = _profile()
    pins = dict(tp=8, pp=16, cp=1, vpp=1, micro_batch_size=1, zero_stage=1, sequence_parallel=True)
    result = search(model, training, profile, "megatron", Pins(**pins))
    best = result.best
    assert best is not None and best.layout.recompute == "full" and best.layout.recompute_layers > 0
    full = search(model, training, profile, "megatron", Pins(**pins, recompute="full", recompute_layers=0)).best
    assert full is not None and best.step_time_s < full.step_time_s
    assert search(model, training, profile, "megatron", Pins(**pins, recompute="none")).best is None
    assert best.layout.short().endswith("rc=full/" + str(best.layout.recompute_layers))
