"""Legality (orchestrator/plan/rules.py): what each runtime refuses to build, said with its numbers
and the fix."""

from __future__ import annotations

import pytest

from orchestrator.plan.layout import Pins
from orchestrator.plan.rules import check_layout
from orchestrator.plan.solver import search
from orchestrator.spec.cluster import load_profile

from .test_moe_costmodel import MIXTRAL, TRAIN, _layout


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
