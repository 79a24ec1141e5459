"""How sure a plan is and what it keeps back: near-ties resolved toward the simpler layout, the
default memory margin from the memory model's own error, the MFU convention, the command that
measures an unmeasured plan, and Megatron's bf16 gradient buffer."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from orchestrator.costmodel.calibration import default_memory_margin, memory_error
from orchestrator.costmodel.flops import layer_forward_flops_per_token, model_flops_per_step
from orchestrator.costmodel.memory import model_state_bytes, state_bytes, step_transient_bytes
from orchestrator.plan.layout import AXIS, PINNABLE, TIEBREAK, Layout
from orchestrator.plan.make import make_plan
from orchestrator.plan.request import PlanRequest
from orchestrator.plan.rules import check_training
from orchestrator.plan.solver import _simplest_first, candidates_of, search
from orchestrator.render.notes import notes_doc, notes_text
from orchestrator.spec.cluster import load_profile
from orchestrator.spec.model import load_spec

from ..conftest import EXAMPLES, PROFILES


def _inputs(name: str, nodes: int = 1):
    spec, _ = load_spec(EXAMPLES / f"{name}.yaml")
    loaded = load_profile("dgx16", PROFILES)
    return spec, loaded, loaded.profile.resized(nodes, None)


def _plan(name: str, runtime: str, nodes: int = 1, **kw):
    spec, loaded, _ = _inputs(name, nodes)
    return make_plan(PlanRequest(spec=spec, spec_path=f"{name}.yaml", spec_sha256="0" * 64, profile=loaded,
                                 runtime=runtime, pins=_pins(), nodes=nodes, **kw))


def _pins():
    from orchestrator.plan.layout import Pins

    return Pins()


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
    # at least as simple on every axis as the fastest
    for n in TIEBREAK:
        assert AXIS[n].code(getattr(chosen.layout, n)) <= AXIS[n].code(getattr(fastest.layout, n)), n
    # every layout within the band is listed, the chosen one apart
    within = [s.layout for s in res.ranked if s.step_time_s <= fastest.step_time_s * (1 + nt.band)]
    assert nt.count == len(within)
    assert {s.layout for s in nt.others} == set(within) - {chosen.layout}


def test_zero_band_keeps_the_fastest_first():
    spec, _, profile = _inputs("llama3-8b")
    layouts = [s.layout for s in search(spec.model, spec.training, profile, "deepspeed", keep=6).ranked]
    cand = candidates_of(spec.model, layouts)
    step = np.array([1.0, 1.001, 1.002, 1.5, 1.6, 1.7])
    order, within = _simplest_first(cand, step, np.arange(6), 0.0)
    assert list(order) == list(range(6)) and len(within) == 0
    # a band covering all: the chosen is no more complex on any axis than the fastest
    order, within = _simplest_first(cand, step, np.arange(6), 1.0)
    first = layouts[int(order[0])]
    assert all(AXIS[n].code(getattr(first, n)) <= AXIS[n].code(getattr(layouts[0], n)) for n in TIEBREAK)
    assert len(within) == 5


def test_default_memory_margin_is_the_memory_models_error():
    under = memory_error()["largest_under"]
    assert under > 0
    margin, origin = default_memory_margin(80.0)
    assert margin == pytest.approx(math.ceil(under * 80 * 10) / 10)
    assert "memory_error" in origin
    p = _plan("llama3-8b", "deepspeed")
    assert p.memory_margin_gib == margin and p.memory_margin_origin == origin
    assert p.result.capacity_gib == pytest.approx(80.0 - margin)
    assert p.chosen.memory_gib["total"] <= 80.0 - margin
    doc = notes_doc(p)
    assert doc["memory_margin"] == {"gib": margin, "origin": origin}
    # an explicit margin wins and is recorded as given
    given = _plan("llama3-8b", "deepspeed", memory_margin_gib=0.0)
    assert given.memory_margin_gib == 0.0 and given.memory_margin_origin is None
    assert notes_doc(given)["memory_margin"]["origin"] == "--memory-margin"


def test_mfu_causal_halves_the_attention_scores():
    spec, _, _ = _inputs("llama3-8b")
    m, t = spec.model, spec.training
    full = model_flops_per_step(m, t.seq_length, t.global_batch_size)
    causal = model_flops_per_step(m, t.seq_length, t.global_batch_size, causal=True)
    _, scores = layer_forward_flops_per_token(m, t.seq_length)
    assert full - causal == pytest.approx(3 * m.num_layers * scores / 2 * t.seq_length * t.global_batch_size)
    assert 0.05 < 1 - causal / full < 0.15  # Llama 3 8B at 8K context
    p = _plan("llama3-8b", "deepspeed")
    mfu = notes_doc(p)["mfu"]
    assert mfu["mfu_causal"] == pytest.approx(p.chosen.mfu * causal / full, abs=1e-4)
    assert any("non-causally" in n for n in notes_text(p))


def test_unmeasured_plan_names_the_trial_and_its_cost():
    p = _plan("llama3-70b", "deepspeed", nodes=16)
    doc = notes_doc(p)
    assert doc["unmeasured_runtime"] and "torchtitan" in doc["unmeasured_runtime"]
    trial = doc["measure"]
    assert trial["command"].startswith("dsorch trial llama3-70b.yaml --cluster dgx16 --nodes 16 --top 1")
    runs = [p.chosen] + [fb.scored for fb in p.result.families if fb.rank not in (None, 1)]
    assert trial["layouts"] == len(runs)
    hours = sum(20 * s.step_time_s for s in runs) * p.profile.world_size / 3600
    assert trial["gpu_hours"] == pytest.approx(hours, abs=0.005)
    assert any("dsorch trial" in n and "GPU-hours" in n for n in notes_text(p))


def test_megatron_plan_outside_the_domain_names_a_short_submit_and_its_cost():
    p = _plan("llama3-70b-128k", "megatron", nodes=16)
    doc = notes_doc(p)
    assert p.chosen.interval is None and doc["outside_fitted_domain"]
    trial = doc["measure"]
    assert trial["command"] == "dsorch submit PLAN_DIR --steps 20 --wait, then dsorch calibrate RUN_DIR --cluster dgx16"
    assert trial["layouts"] == 1
    assert trial["gpu_hours"] == pytest.approx(20 * p.chosen.step_time_s * p.profile.world_size / 3600, abs=0.005)
    assert any("dsorch submit PLAN_DIR" in n and "GPU-hours" in n for n in notes_text(p))


def test_megatron_in_domain_plan_has_nothing_to_measure():
    p = _plan("llama3-70b", "megatron", nodes=16, memory_margin_gib=0.0)
    doc = notes_doc(p)
    assert p.chosen.interval is not None
    assert doc["measure"] is None and doc["unmeasured_runtime"] is None


def test_megatron_bf16_gradient_buffer():
    """Megatron-Core's bytes per parameter with the distributed optimizer (docs/user-guide/features/
    dist_optimizer.md): bf16 params with fp32 grads 6 + 12/d; with bf16 grads the table's 4 + 16/d
    counts the optimizer step's fp32 main-grad copy, which lives only while the activations do not
    (zero_grad frees it before the next forward): 4 + 12/d across steps, 4/d in the step."""
    for fp32, (fixed, sharded, step) in ((True, (6, 12, 0)), (False, (4, 12, 4))):
        w, g, o = model_state_bytes(1.0, 8, 1, *state_bytes("megatron", "bf16", 1, fp32))
        assert w + g == fixed and o == pytest.approx(sharded / 8)
        assert step_transient_bytes("megatron", "bf16", fp32) == step
    assert step_transient_bytes("deepspeed", "bf16", False) == 0
    spec, _, profile = _inputs("llama3-8b")
    t = spec.training.model_copy(update={"grad_reduce_in_fp32": False})
    assert not any("grad_reduce" in p for p in check_training(t, profile, "megatron"))
    assert any("grad_reduce_in_fp32" in p for p in check_training(t, profile, "deepspeed"))
    L = Layout(
        tp=2,
        pp=1,
        dp=4,
        vpp=1,
        zero_stage=1,
        micro_batch_size=1,
        grad_accum_steps=spec.training.global_batch_size // 4,
        recompute="none",
        sequence_parallel=True,
    )
    from orchestrator.costmodel import evaluate

    # Without recomputation at dp 4 the activations outweigh the step's 4/d copy; with full
    # recomputation at dp 1 they do not, and the copy's excess over them is the optimizer's.
    for recompute, dp, excess in (("none", 4, False), ("full", 1, True)):
        gas = spec.training.global_batch_size // dp
        cand = candidates_of(spec.model, [dataclasses.replace(L, recompute=recompute, dp=dp, grad_accum_steps=gas)])
        a = evaluate(spec.model, spec.training, profile, "megatron", cand).memory
        b = evaluate(spec.model, t, profile, "megatron", cand).memory
        assert float(a.grads[0]) == pytest.approx(2 * float(b.grads[0]))
        assert float(b.activations[0]) == pytest.approx(float(a.activations[0]))
        step_copy = float(a.optimizer[0]) * 4 / 12
        assert (step_copy > float(b.activations[0])) == excess
        extra = max(0.0, step_copy - float(b.activations[0]))
        assert float(b.optimizer[0]) == pytest.approx(float(a.optimizer[0]) + extra)
        assert float(b.total[0]) == pytest.approx(float(a.total[0]) - float(b.grads[0]) + extra)
