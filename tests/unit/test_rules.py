"""Legality (orchestrator/plan/rules.py): what each runtime refuses to build, said with its numbers
and the fix; the values the solver may enumerate for an axis."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.plan.layout import Pins
from orchestrator.plan.rules import check_layout, recompute_layer_options, stage_split
from orchestrator.plan.solver import search
from orchestrator.runtimes import DEEPSPEED, MEGATRON
from orchestrator.spec.cluster import load_profile
from orchestrator.spec.model import load_spec

from ..conftest import EXAMPLES
from .test_moe_costmodel import MIXTRAL, TRAIN, _layout
from .test_partial_recompute import META, _profile, _spec


@pytest.mark.parametrize("L, words", [
    (_layout(ep=3), "does not divide the 8 routed experts"),
    (_layout(ep=8, etp=16), "does not divide tp*cp*dp"),
    (_layout(tp=2, dp=32, ep=8), "needs sequence parallelism"),
])
def test_rules_say_what_megatron_would_refuse(L, words):
    profile = load_profile("dgx16").profile.resized(nodes=8)
    assert any(words in r for r in check_layout(L, MIXTRAL, TRAIN, profile, "megatron"))


def test_dense_models_have_no_expert_axis():
    profile = load_profile("dgx16").profile.resized(nodes=8)
    dense = MIXTRAL.model_copy(update={"moe": None})
    assert any("this model is dense" in r for r in check_layout(_layout(ep=2), dense, TRAIN, profile, "megatron"))


def test_the_entrypoint_splits_experts_over_tp_and_carves_ep_from_dp():
    profile = load_profile("dgx16").profile.resized(nodes=8)
    problems = check_layout(_layout(tp=2, dp=32, ep=4, etp=1), MIXTRAL, TRAIN, profile, "deepspeed")
    assert any("etp equals tp=2" in r for r in problems)
    res = search(MIXTRAL, TRAIN, profile, "deepspeed", Pins(tp=2, pp=1, ep=4), memory_margin_gib=-1e6, keep=1)
    assert res.best is not None and res.best.layout.etp == 2 and res.best.layout.zero_stage in (1, 2)
    zero3 = check_layout(_layout(dp=64, ep=4, zero_stage=3), MIXTRAL, TRAIN, profile, "deepspeed")
    assert any("ZeRO-1 and 2 only" in r for r in zero3)
    assert not check_layout(_layout(dp=64, ep=1, zero_stage=3, grad_accum_steps=4), MIXTRAL, TRAIN, profile,
                            "deepspeed")


def test_searched_values_and_pins():
    model, _ = _spec()
    split = stage_split(model.num_layers, 16)  # 8 layers a stage
    assert recompute_layer_options(model, MEGATRON, split, 1) == [0, 2, 4, 6]
    assert recompute_layer_options(model, MEGATRON, split, 4) == [0, 1]  # 2-layer virtual stages
    assert recompute_layer_options(model, MEGATRON, split, 1, pinned=7) == [7]
    assert recompute_layer_options(model, MEGATRON, split, 1, pinned=8) == []
    assert recompute_layer_options(model, DEEPSPEED, split, 1) == [0]


@pytest.mark.parametrize(
    "change, runtime, words",
    [
        (dict(recompute="selective", recompute_layers=3), "megatron", "needs --recompute-granularity full"),
        (dict(recompute_layers=8), "megatron", "not below the 8 layers"),
        (dict(vpp=2, recompute_layers=4), "megatron", "not below the 4 layers"),
        (dict(recompute_layers=3), "deepspeed", "bundled DeepSpeed entrypoint checkpoints every decoder layer"),
    ],
)
def test_refused_where_it_cannot_run(change, runtime, words):
    model, training = _spec()
    L = dataclasses.replace(META, **change)
    if runtime == "deepspeed":
        L = dataclasses.replace(L, vpp=1)
    msgs = check_layout(L, model, training, _profile(), runtime)
    assert any(words in m for m in msgs), msgs


def test_the_flex_dispatcher_never_leads_the_search_into_a_refused_layout():
    """Issue 37: with training.moe_dispatcher flex the search chose ep 1 etp 1 (here on one dgx-b200
    node: tp1 pp1 dp8 ep1), which Megatron-Core's DeepEP refuses and the plan's own validation then
    rejected. The rule that refuses it is the one the enumeration skips by."""
    from orchestrator.plan.solver import RULE_DISPATCH

    spec, _ = load_spec(EXAMPLES / "qwen3-30b-a3b.yaml")
    flex = spec.training.model_copy(update={"moe_dispatcher": "flex"})
    profile = load_profile("dgx-b200").profile.resized(nodes=1)
    res = search(spec.model, flex, profile, "megatron", keep=1000)
    assert res.best is not None and res.rejected_rules.get(RULE_DISPATCH, 0) > 0
    assert all(s.layout.ep * s.layout.etp > 1 for s in res.ranked + res.closest)
    ep1 = _layout(tp=1, dp=8, ep=1, etp=1)
    assert any(
        "DeepEP dispatcher requires TPxEP > 1" in r for r in check_layout(ep1, spec.model, flex, profile, MEGATRON)
    )
    # unset, the dispatcher at ep 1 is alltoall; the deepspeed runtime has no token dispatcher
    assert not any("flex" in r for r in check_layout(ep1, spec.model, spec.training, profile, MEGATRON))
    assert not any("flex" in r for r in check_layout(ep1, spec.model, flex, profile, DEEPSPEED))
    # pinned, ep 1 etp 1 is refused (make_plan explains it with check_layout); ep 1 etp 2 is legal
    assert search(spec.model, flex, profile, "megatron", Pins(ep=1, etp=1)).evaluated == 0
    assert search(spec.model, flex, profile, "megatron", Pins(ep=1, etp=2)).best is not None
