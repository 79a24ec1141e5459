"""What a plan says beside its numbers (orchestrator/render/notes.py): the default memory margin from
the memory model's own error, the MFU convention, and the command that measures an unmeasured plan."""

from __future__ import annotations

import math

import pytest

from orchestrator.costmodel.calibration import default_memory_margin, memory_error
from orchestrator.costmodel.flops import layer_forward_flops_per_token, model_flops_per_step
from orchestrator.plan.make import make_plan
from orchestrator.plan.request import PlanRequest
from orchestrator.render.notes import notes_doc, notes_text

from .test_solver import _inputs


def _plan(name: str, runtime: str, nodes: int = 1, **kw):
    spec, loaded, _ = _inputs(name, nodes)
    return make_plan(PlanRequest(spec=spec, spec_path=f"{name}.yaml", spec_sha256="0" * 64, profile=loaded,
                                 runtime=runtime, pins=_pins(), nodes=nodes, **kw))


def _pins():
    from orchestrator.plan.layout import Pins

    return Pins()


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


def test_bf16_plan_on_a_rate_only_fp8_runs_measured_says_so():
    """Issue 37: Llama 3 70B in BF16 on GB200 ran at a GEMM rate borrowed from GB300 runs that were all
    FP8, with the GB200 entry's +-2 % interval; the plan names the entry and its runs' precision, and
    states no interval. Its predicted MFU is above the best any BF16 run measured on GB200: flagged."""
    from orchestrator.spec.cluster import load_profile

    from ..conftest import PROFILES

    spec, _, _ = _inputs("llama3-70b")
    loaded = load_profile("gb200-nvl72", PROFILES)
    p = make_plan(PlanRequest(spec=spec, spec_path="llama3-70b.yaml", spec_sha256="0" * 64, profile=loaded,
                              runtime="megatron", pins=_pins(), nodes=8))
    doc = notes_doc(p)
    moved = doc["rate_transfer"]
    assert moved is not None and moved["entry"] == "megatron/gb300-nvl72" and moved["borrowed"]
    assert moved["precision"] == "bf16" and moved["gpu"] == "GB200" and moved["gemm"] == pytest.approx(0.9494)
    assert len(moved["runs"]) == 3 and moved["plan_entry"] == "megatron/gb200-nvl72"
    assert p.chosen.interval is None and doc["outside_fitted_domain"]
    text = notes_text(p)
    sentence = next(n for n in text if n.startswith("llama3-70b in BF16 on GB200 is predicted at"))
    assert "0.95, borrowed from megatron/gb300-nvl72, whose 3 dense runs (all FP8, on GB300)" in sentence
    assert "states no interval" in sentence and "does not cover it" in sentence
    above = doc["mfu_above_measured"]
    assert above is not None and above["predicted"] == pytest.approx(p.chosen.mfu, abs=1e-4)
    assert above["run"] == "mb2511-gb200-qwen3-235b-a22b-bf16-256g-tp1pp8vp3ep32-mbs1"
    assert above["best_measured"] == pytest.approx(0.3289) and above["best_measured"] < above["predicted"]
    assert any(f"{100 * above['best_measured']:.1f} % ({above['run']}, GB200)" in n for n in text)
    assert notes_doc(p) == doc  # deterministic


def test_plan_within_what_its_runs_measured_has_no_transfer_note():
    p = _plan("llama3-70b", "megatron", nodes=16, memory_margin_gib=0.0)
    doc = notes_doc(p)
    assert doc["rate_transfer"] is None
    assert doc["mfu_above_measured"] is None or doc["mfu_above_measured"]["predicted"] > 0.4943
