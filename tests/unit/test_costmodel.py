"""The cost model against published worked examples and its own invariants."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.costmodel import Candidates, evaluate
from orchestrator.costmodel.memory import activation_bytes_per_layer, model_state_bytes, moe_activation_bytes_per_layer
from orchestrator.costmodel.stacks import (
    MEMORY_KEYS,
    MEMORY_LABELS,
    MEMORY_PARTS,
    TIME_KEYS,
    TIME_LABELS,
    TIME_PARTS,
)
from orchestrator.plan.solver import enumerate_layouts, search
from orchestrator.spec.cluster import load_profile
from orchestrator.spec.model import ModelSpec, load_spec
from orchestrator.spec.training import TrainingSpec

from ..conftest import EXAMPLES


# ---- ZeRO paper, Fig. 1: 7.5B parameters, N_d = 64, K = 12 -> 120 / 31.4 / 16.6 / 1.9 GB per device.
# The paper prints one decimal; the formula's exact values are 120, 31.406, 16.641 and 1.875 GB.
@pytest.mark.parametrize(
    "stage, printed, exact", [(0, 120.0, 120.0), (1, 31.4, 31.40625), (2, 16.6, 16.640625), (3, 1.9, 1.875)]
)
def test_zero_paper_model_states(stage, printed, exact):
    w, g, o = model_state_bytes(7.5e9, 64, stage, 2, 2, 12)
    gb = float(w + g + o) / 1e9
    assert gb == pytest.approx(exact, rel=1e-12)
    assert round(gb, 1) == printed


# ---- Korthikanti et al. 2022, Table 2 applied to a GPT-3 175B layer (s=2048, b=1, h=12288, a=96, t=8);
# the paper's Table 2 formulas are in the comments of each row; exact to the byte.
GPT3 = dict(s=2048, b=1, h=12288, f=4 * 12288, a=96, kv=96)
KORTHIKANTI = [
    # (t, sp, recompute, bytes per layer)
    (1, False, 0, 2_868_903_936),  # no parallelism: sbh(34 + 5as/h)
    (8, False, 0, 578_813_952),  # TP: sbh(10 + 24/t + 5as/(ht))
    (8, True, 0, 358_612_992),  # TP + SP: sbh/t (34 + 5as/h)
    (8, False, 1, 327_155_712),  # TP + selective: sbh(10 + 24/t)
    (8, True, 1, 106_954_752),  # TP + SP + selective: 34 sbh/t
    (8, False, 2, 50_331_648),  # full recompute: 2sbh
]


@pytest.mark.parametrize("t, sp, rc, expected", KORTHIKANTI, ids=["none", "tp", "tp+sp", "tp+sel", "tp+sp+sel", "full"])
def test_korthikanti_activation_table(t, sp, rc, expected):
    got = activation_bytes_per_layer(
        GPT3["s"],
        GPT3["b"],
        GPT3["h"],
        GPT3["f"],
        GPT3["a"],
        GPT3["kv"],
        t,
        sp,
        rc,
        swiglu=False,
        flash=False,
        hidden_dropout=True,
        attention_dropout=True,
    )
    assert float(got) == expected


def test_flash_attention_drops_the_score_matrices():
    kw = dict(swiglu=False, hidden_dropout=True, attention_dropout=True)
    plain = activation_bytes_per_layer(2048, 1, 12288, 49152, 96, 96, 8, True, 0, flash=False, **kw)
    flash = activation_bytes_per_layer(2048, 1, 12288, 49152, 96, 96, 8, True, 0, flash=True, **kw)
    sbh = 2048 * 12288
    # sbh/t * 34 remain, plus the fp32 log-sum-exp (4 a s b / t) instead of 5as^2b/t.
    assert float(flash) == 34 * sbh / 8 + 4 * 96 * 2048 / 8
    assert float(plain) > float(flash)


def test_moe_activation_terms_vectorize_and_scale_with_the_routed_copies():
    """One call over arrays of layouts equals a call per layout; the routed terms grow with top_k
    (2 x the hidden vector, the expert GEMM outputs, an index and a probability per copy); full
    recomputation keeps none. The terms themselves are checked to the byte against the entrypoint's
    layer by tests/system/test_activation_census.py."""
    kw = dict(
        num_experts=64, top_k=6, expert_ffn=1408, shared_ffn=2816, router="sigmoid", load_balancing="seq_aux_loss"
    )
    t, sp, rc = np.array([1, 2, 8, 8]), np.array([False, True, False, True]), np.array([0, 1, 0, 2])
    got = moe_activation_bytes_per_layer(4096, 1, 2048, t, sp, rc, **kw)
    each = [
        float(moe_activation_bytes_per_layer(4096, 1, 2048, int(a), bool(b), int(c), **kw))
        for a, b, c in zip(t, sp, rc)
    ]
    assert got.tolist() == each and each[3] == 0.0
    more = moe_activation_bytes_per_layer(4096, 1, 2048, 1, False, 0, **{**kw, "top_k": 7})
    # a routed copy: expert input and output (2 x 2h), gate/up and down-projection input (2 x 3f), the
    # combining probability (2), the sorted route and its token (8 + 8), the chosen expert (8), and the
    # renormalisation's kept score (4)
    assert float(more - got[0]) == 4096 * (2 * 2 * 2048 + 2 * 3 * 1408 + 2 + 16 + 8 + 4)


# ---- invariants over many layouts of randomly shaped models
@st.composite
def model_and_training(draw):
    heads = draw(st.sampled_from([8, 16, 32, 64]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, 8, heads) if heads % h == 0]))
    head_dim = draw(st.sampled_from([64, 128]))
    layers = draw(st.sampled_from([8, 12, 16, 24, 32, 40, 80]))
    model = ModelSpec(
        num_layers=layers,
        hidden_size=heads * head_dim,
        ffn_hidden_size=draw(st.sampled_from([2, 3, 4])) * heads * head_dim,
        num_attention_heads=heads,
        num_kv_heads=kv,
        vocab_size=draw(st.sampled_from([32000, 50257, 128256])),
        activation=draw(st.sampled_from(["swiglu", "gelu"])),
    )
    training = TrainingSpec(
        seq_length=draw(st.sampled_from([1024, 2048, 4096])),
        global_batch_size=draw(st.sampled_from([64, 128, 256])),
        flash_attention=draw(st.booleans()),
    )
    return model, training


def _profile(nodes):
    return load_profile("dgx16").profile.resized(nodes=nodes)


def _vary(c: Candidates, **changes) -> Candidates:
    return dataclasses.replace(c, **{k: np.full_like(getattr(c, k), v) for k, v in changes.items()})


def _states(ev):
    """Model states per GPU: weights, gradients, optimizer states."""
    return ev.memory.params + ev.memory.grads + ev.memory.optimizer


def test_each_stack_is_its_parts_and_their_sum_and_every_field_has_a_label():
    """The stacks' fields are the one list every reader shows (plan.yaml, --explain, plan.md, plots):
    the last field of each is the sum of the others, and each has a label."""
    spec, _ = load_spec(EXAMPLES / "llama3-70b.yaml")
    profile = _profile(4)
    c, _ = enumerate_layouts(spec.model, spec.training, profile, "deepspeed")
    ev = evaluate(spec.model, spec.training, profile, "deepspeed", c)
    assert MEMORY_KEYS == (*MEMORY_PARTS, "total") and TIME_KEYS == (*TIME_PARTS, "step")
    assert np.allclose(sum(getattr(ev.memory, k) for k in MEMORY_PARTS), ev.memory.total, rtol=1e-12)
    assert np.allclose(sum(getattr(ev.time, k) for k in TIME_PARTS), ev.time.step, rtol=1e-12)
    assert list(MEMORY_LABELS) == list(MEMORY_KEYS) and list(TIME_LABELS) == list(TIME_KEYS)


@settings(max_examples=25, deadline=None)
@given(model_and_training(), st.sampled_from([1, 2, 4]), st.sampled_from(["deepspeed", "megatron"]))
def test_invariants(mt, nodes, runtime):
    model, training = mt
    profile = _profile(nodes)
    c, _ = enumerate_layouts(model, training, profile, runtime)
    if len(c) == 0:
        return
    ev = evaluate(model, training, profile, runtime, c)
    # Step time is never below the compute of the binding stage at 100% of peak.
    assert np.all(ev.time.step >= ev.compute_at_peak * (1 - 1e-9))
    # tp = 1 means no tensor-parallel traffic.
    assert np.all(ev.time.tp_comm[c.tp == 1] == 0)
    assert np.all(ev.time.pp_comm[c.pp == 1] == 0) and np.all(ev.time.bubble[c.pp == 1] == 0)
    # Memory is at least the local parameter shard, and every component is non-negative.
    for k in MEMORY_PARTS:
        assert np.all(getattr(ev.memory, k) >= 0)
    assert np.all(ev.memory.total >= ev.memory.params)
    # Memory is monotone in ZeRO stage (for stages the runtime allows with that pp).
    base = c.take(c.pp == 1)
    if len(base):
        stages = (0, 1, 2, 3) if runtime == "deepspeed" else (0, 1)
        states = [evaluate(model, training, profile, runtime, _vary(base, zero_stage=z)) for z in stages]
        for lo, hi in zip(states, states[1:]):
            assert np.all(_states(hi) <= _states(lo) + 1e-6)
    # ... and in recompute level: none >= selective >= full (every layer) ...
    acts = [
        evaluate(model, training, profile, runtime, _vary(c, recompute=r, recompute_layers=0)).memory.activations
        for r in (0, 1, 2)
    ]
    assert np.all(acts[0] >= acts[1] - 1e-6) and np.all(acts[1] >= acts[2] - 1e-6)
    # ... and full recomputation of one layer per stage lies between none and full.
    one = evaluate(model, training, profile, runtime, _vary(c, recompute=2, recompute_layers=1)).memory.activations
    assert np.all(acts[0] >= one - 1e-6) and np.all(one >= acts[2] - 1e-6)


@settings(max_examples=25, deadline=None)
@given(model_and_training(), st.sampled_from(["deepspeed", "megatron"]))
def test_activation_memory_monotone_in_micro_batch(mt, runtime):
    model, training = mt
    profile = _profile(2)
    c, _ = enumerate_layouts(model, training, profile, runtime)
    if len(c) == 0:
        return
    ev = evaluate(model, training, profile, runtime, c)
    # Group by everything except the micro-batch size; activations must not decrease as it grows.
    key = np.stack(
        [c.tp, c.cp, c.pp, c.vpp, c.zero_stage, c.recompute, c.recompute_layers, c.sequence_parallel.astype(int)],
        axis=1,
    )
    for k in np.unique(key, axis=0):
        idx = np.flatnonzero((key == k).all(axis=1))
        idx = idx[np.argsort(c.micro_batch_size[idx])]
        assert np.all(np.diff(ev.memory.activations[idx]) >= -1e-6)


@pytest.mark.parametrize("name", ["llama3-70b", "llama3-405b", "gpt3-175b"])
def test_no_fitting_layout_exceeds_gpu_memory(name):
    spec, _ = load_spec(EXAMPLES / f"{name}.yaml")
    profile = _profile(16)
    res = search(spec.model, spec.training, profile, "deepspeed", keep=10_000)
    assert res.feasible == len(res.ranked) or len(res.ranked) == 10_000
    assert all(s.memory_gib["total"] <= profile.gpu.memory_gib for s in res.ranked)
    assert all(s.memory_gib["total"] > profile.gpu.memory_gib for s in res.closest)
    # Fastest first, but for the simplest near-tie, which is within the band of the fastest.
    times = [s.step_time_s for s in res.ranked]
    assert times[1:] == sorted(times[1:])
    assert times[0] <= min(times) * (1 + res.near_ties.band)


def test_zero3_state_below_zero1_state():
    spec, _ = load_spec(EXAMPLES / "llama3-8b.yaml")
    profile = _profile(1)
    c, _ = enumerate_layouts(spec.model, spec.training, profile, "deepspeed")
    c = c.take(c.pp == 1)
    z1 = evaluate(spec.model, spec.training, profile, "deepspeed", _vary(c, zero_stage=1))
    z3 = evaluate(spec.model, spec.training, profile, "deepspeed", _vary(c, zero_stage=3))
    s1, s3 = _states(z1), _states(z3)
    assert np.all(s3[c.dp > 1] < s1[c.dp > 1])


def test_invariant_checker_catches_a_broken_evaluation():
    from orchestrator.costmodel.evaluate import invariant_violations

    spec, _ = load_spec(EXAMPLES / "llama3-8b.yaml")
    profile = _profile(1)
    c, _ = enumerate_layouts(spec.model, spec.training, profile, "deepspeed")
    ev = evaluate(spec.model, spec.training, profile, "deepspeed", c)
    assert invariant_violations(c, ev) == []
    broken = dataclasses.replace(
        ev,
        time=dataclasses.replace(ev.time, tp_comm=ev.time.tp_comm + 1.0),
        memory=dataclasses.replace(ev.memory, total=ev.memory.params * 0.5),
    )
    found = invariant_violations(c, broken)
    assert "tensor-parallel traffic with tp = 1" in found
    assert "total memory below the local parameter shard" in found


# ---- time-model physics beyond the formulas
def _one(model, training, profile, runtime, **pins):
    from orchestrator.plan.layout import Pins

    c, _ = enumerate_layouts(model, training, profile, runtime, Pins(**pins))
    assert len(c) == 1, pins
    return c, evaluate(model, training, profile, runtime, c)


ALL_PINNED = dict(vpp=1, zero_stage=1, recompute="none", sequence_parallel=False)


def test_small_gemms_run_below_peak():
    """Achieved FLOP rate of the compute term grows with hidden size and micro-batch (additive roofline)."""
    profile = _profile(1)
    rates = []
    for h in (512, 2048, 8192):
        m = ModelSpec(
            num_layers=8, hidden_size=h, ffn_hidden_size=4 * h, num_attention_heads=h // 128, vocab_size=32000
        )
        t = TrainingSpec(seq_length=1024, global_batch_size=64)
        c, ev = _one(m, t, profile, "megatron", tp=1, pp=1, dp=8, micro_batch_size=1, **ALL_PINNED)
        rates.append(float(ev.compute_at_peak[0] / ev.time.compute[0]))
    assert rates[0] < rates[1] < rates[2] <= 1.0
    assert rates[0] < 0.6 * rates[2]


def test_dp_reduction_is_hierarchical_across_nodes():
    spec, _ = load_spec(EXAMPLES / "llama3-8b.yaml")
    one = _profile(1)
    _, inside = _one(spec.model, spec.training, one, "megatron", tp=1, pp=1, dp=8, micro_batch_size=1, **ALL_PINNED)
    four = _profile(4)
    _, across = _one(spec.model, spec.training, four, "megatron", tp=4, pp=1, dp=8, micro_batch_size=1, **ALL_PINNED)
    # Same number of DP members; across nodes the NIC share is slower than NVLink, but each carries
    # only 1/k of the bytes (k = 2 members per node), so it is not dp times slower either.
    ratio = float(across.dp_comm_total[0] / (inside.dp_comm_total[0] / 4))  # tp=4 shards the gradients 4x
    assert 1.5 < ratio < 8


def test_engine_overlaps_follow_the_runtime():
    from orchestrator.costmodel.engines import ENGINES

    spec, _ = load_spec(EXAMPLES / "llama3-70b.yaml")
    profile = _profile(4)
    pins = dict(
        tp=8,
        pp=2,
        dp=2,
        micro_batch_size=1,
        vpp=1,
        zero_stage=1,
        recompute="full",
        recompute_layers=0,
        sequence_parallel=True,
    )
    c, ds = _one(spec.model, spec.training, profile, "deepspeed", **pins)
    # DeepSpeed's pipeline engine reduces after the flush: nothing of the reduction is hidden.
    assert float(ds.time.dp_comm[0]) == pytest.approx(float(ds.dp_comm_total[0]))
    c, mg = _one(spec.model, spec.training, profile, "megatron", **pins)
    assert float(mg.time.dp_comm[0]) < float(mg.dp_comm_total[0])
    overlapped = dataclasses.replace(ENGINES["megatron"], tp_overlap=True)
    tpo = evaluate(spec.model, spec.training, profile, "megatron", c, engine=overlapped)
    assert float(tpo.time.tp_comm[0]) < float(mg.time.tp_comm[0]) and float(tpo.tp_comm_total[0]) == float(
        mg.tp_comm_total[0]
    )
    assert float(tpo.time.step[0]) >= float(tpo.compute_at_peak[0])


def test_buffers_and_framework():
    spec, _ = load_spec(EXAMPLES / "llama3-8b.yaml")
    profile = _profile(1)
    c, _ = enumerate_layouts(spec.model, spec.training, profile, "deepspeed")
    ev = evaluate(spec.model, spec.training, profile, "deepspeed", c)
    assert np.all(ev.memory.framework == profile.memory_overhead_gib * 2**30)
    # bf16: ZeRO-1 runs in DeepSpeed's BF16_Optimizer (fp32 accumulation), which keeps no reduce buckets.
    assert np.all(ev.memory.comm_buffers[c.zero_stage <= 1] == 0) and np.all(
        ev.memory.comm_buffers[c.zero_stage >= 2] > 0
    )
