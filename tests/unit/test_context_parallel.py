"""Context parallelism as Transformer Engine runs it under Megatron-LM (cost model: evaluate._cp_comm):
the p2p ring's steps each hidden behind one block of attention, the a2a and all_gather exchanges
exposed, and what the split adds (per-step launches, the partial outputs and their correction).
The accounting of each cp_comm_type is checked against the arithmetic written out here from the
profile's numbers; the type reaches Megatron's flags and is refused where Transformer Engine
refuses it."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from orchestrator.cli.main import main
from orchestrator.costmodel import evaluate
from orchestrator.costmodel.calibration import per_layout
from orchestrator.costmodel.comm_cp import CP_STEP_OVERHEAD_S
from orchestrator.plan.layout import Layout, Pins
from orchestrator.plan.rules import check_layout
from orchestrator.plan.solver import candidates_of, search
from orchestrator.spec.cluster import load_profile
from orchestrator.spec.model import load_spec
from orchestrator.validate.megatron import check_megatron_args, parse_args_lines

from ..conftest import EXAMPLES

# Every layer recomputed (recompute_layers 0): with partial recomputation searched, cp's smaller
# activations let more layers skip it, which can outweigh the exchange (a real gain of cp).
PINS = dict(tp=1, pp=1, recompute="full", recompute_layers=0)


def _layout(**kw) -> Layout:
    """A Megatron layout of these tests: one sequence per micro-batch, 512 of them, no recomputation."""
    base = dict(tp=1, pp=1, dp=1, vpp=1, zero_stage=1, micro_batch_size=1, grad_accum_steps=512, recompute="none",
                sequence_parallel=False)
    return Layout(**{**base, **kw})


def _spec(**training):
    spec, _ = load_spec(EXAMPLES / "llama3-8b.yaml")
    return spec.model, spec.training.model_copy(update=training)


def _one_node():
    return load_profile("dgx16").profile.resized(nodes=1)


def test_step_time_rises_with_cp_on_one_node():
    """The issue's plan: Llama 3 8B on one H100 node, tp1 pp1, full recomputation. cp 1, 2, 4, 8
    used to give the same step time (the exchange priced as free)."""
    model, training = _spec()
    profile = _one_node()
    best = {}
    for cp in (1, 2, 4, 8):
        result = search(model, training, profile, "megatron", Pins(cp=cp, **PINS))
        top = result.best
        assert top is not None and top.layout.cp == cp
        best[cp] = top
    steps = [best[cp].step_time_s for cp in (1, 2, 4, 8)]
    assert all(a < b for a, b in zip(steps, steps[1:], strict=False)), steps
    assert best[1].time_s["cp_comm"] == 0.0
    assert all(best[cp].time_s["cp_comm"] > 0.0 for cp in (2, 4, 8))


def test_explain_shows_the_exchange(runner):
    r = runner.invoke(
        main,
        [
            "plan",
            str(EXAMPLES / "llama3-8b.yaml"),
            "--cluster",
            "dgx16",
            "--nodes",
            "1",
            "--runtime",
            "megatron",
            "--tp",
            "1",
            "--pp",
            "1",
            "--recompute",
            "full",
            "--recompute-layers",
            "0",
            "--cp",
            "2",
            "--explain",
            "--no-write",
        ],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    header = next(line for line in r.output.splitlines() if "CP comm" in line)
    row = next(line for line in r.output.splitlines() if line.startswith("* tp1 cp2"))
    numbers = re.findall(r"\d+\.\d+", row.split("rc=full", 1)[1])
    names = header.split("layout", 1)[1].replace("TP comm", "TP_comm").replace("PP sends", "PP_sends")
    names = names.replace("DP comm", "DP_comm").replace("CP comm", "CP_comm").replace("EP a2a", "EP_a2a").split()
    assert float(numbers[names.index("CP_comm")]) > 0.0


def _p2p(n, kv_b, q_b, o_b, bw, lat, att_f, att_b, hbm, e):
    """(forward, backward) exposed seconds of a p2p ring of n ranks, per layer and micro-batch."""
    fwd = (n - 1) * max(0.0, kv_b / bw + lat - att_f / n) + n * CP_STEP_OVERHEAD_S
    fwd += ((n - 1) * (q_b + o_b) + n * (o_b / e) * (e + 8)) / hbm
    bwd = 2 * max(0.0, kv_b / bw + lat - att_b / n) + (n - 2) * max(0.0, 2 * kv_b / bw + lat - att_b / n)
    bwd += n * CP_STEP_OVERHEAD_S + ((n - 1) * 2 * (q_b + o_b) + n * 3 * (q_b + kv_b)) / hbm
    return fwd, bwd


def _a2a(n, moved, bw, lat, hbm):
    return (n - 1) / n * moved / bw + 4 * lat + 2 * moved / hbm


def _hand(model, training, profile, L: Layout, kind: str) -> float:
    """Exposed seconds per step of the cp exchange, written out from Transformer Engine's
    context_parallel.py: inside a node the cp group talks over NVLink; a2a+p2p's ring crosses nodes
    on the GPU's share of the NICs (its a2a level: the 4 cp ranks of a node at tp 2)."""
    eff = {k: float(np.ravel(v)[0]) for k, v in per_layout(profile, "megatron", np.array([L.zero_stage]))[0].items()}
    s, cp, tp, mbs = training.seq_length, L.cp, L.tp, L.micro_batch_size
    h, a, kv, d = model.hidden_size, model.num_attention_heads, model.kv_heads, model.head_dim
    e = 2.0  # bf16
    T = s / cp * mbs
    q_b = o_b = T * h / tp * e
    kv_b = 2 * T * kv * d / tp * e
    bw = profile.intra_node.bandwidth_gbps * 1e9 / 2 * eff["intra_node_comm"]
    lat = profile.intra_node.latency_us * 1e-6
    ib = profile.inter_node.bandwidth_gbps / 8 * 1e9 * profile.inter_node.nics_per_node / 8 * eff["inter_node_comm"]
    ib_lat = profile.inter_node.latency_us * 1e-6
    hbm = profile.gpu.hbm_bandwidth_gbps * 1e9 * eff["hbm"]
    peak = profile.gpu.peak_tflops.bf16 * 1e12
    # FlashAttention's causal half of this rank's s/cp queries against all s keys, plus Q, K, V, O.
    att_f = (
        0.5 * 4 * mbs * (a / tp) * (s / cp) * s * d / (peak * eff["attention"])
        + T * (2 * h + 2 * kv * d) / tp * e / hbm
    )
    att_b = 2.5 * att_f
    if kind == "p2p":
        fwd, bwd = _p2p(cp, kv_b, q_b, o_b, bw, lat, att_f, att_b, hbm, e)
    elif kind == "a2a":
        fwd = bwd = _a2a(cp, q_b + kv_b + o_b, bw, lat, hbm)
    elif kind == "a2a+p2p":
        inner = 8 // tp
        fwd, bwd = _p2p(cp // inner, kv_b, q_b, o_b, ib, ib_lat, att_f, att_b, hbm, e)
        fwd, bwd = fwd + _a2a(inner, q_b + kv_b + o_b, bw, lat, hbm), bwd + _a2a(inner, q_b + kv_b + o_b, bw, lat, hbm)
    else:
        gather = (cp - 1) * kv_b / bw + 2 * (cp - 1) * lat
        fwd = gather + 2 * cp * kv_b / hbm + 2 * CP_STEP_OVERHEAD_S
        bwd = 2 * gather + 2 * cp * kv_b / hbm + 2 * CP_STEP_OVERHEAD_S
    passes = 2 if L.recompute in ("full", "selective") else 1
    return L.grad_accum_steps * model.num_layers * (passes * fwd + bwd)


@pytest.mark.parametrize("kind", ["p2p", "a2a", "all_gather"])
@pytest.mark.parametrize("recompute,mbs", [("full", 2), ("none", 1)])
def test_each_exchange_matches_its_arithmetic(kind, recompute, mbs):
    model, training = _spec(cp_comm_type=kind)
    profile = _one_node()
    L = _layout(dp=2, micro_batch_size=mbs, grad_accum_steps=512 // (2 * mbs), recompute=recompute, cp=4)
    assert check_layout(L, model, training, profile, "megatron") == []
    ev = evaluate(model, training, profile, "megatron", candidates_of(model, [L]))
    assert float(ev.time.cp_comm[0]) == pytest.approx(_hand(model, training, profile, L, kind), rel=1e-9)


def test_the_ring_shows_when_a_block_is_shorter_than_its_transfer():
    """A short sequence: a block of attention (~ s/cp x s/cp) no longer covers the KV chunk's
    transfer (~ s/cp), so the p2p ring is partly exposed, and more so than the blocks alone."""
    model, training = _spec(seq_length=512)
    profile = _one_node()
    L = _layout(cp=8)
    ev = evaluate(model, training, profile, "megatron", candidates_of(model, [L]))
    hand = _hand(model, training, profile, L, "p2p")
    assert float(ev.time.cp_comm[0]) == pytest.approx(hand, rel=1e-9)
    eff = {k: float(np.ravel(v)[0]) for k, v in per_layout(profile, "megatron", np.array([1]))[0].items()}
    kv_b = 2 * 512 / 8 * model.kv_heads * model.head_dim * 2.0
    bw = profile.intra_node.bandwidth_gbps * 1e9 / 2 * eff["intra_node_comm"]
    overheads_only = 512 * model.num_layers * 2 * 8 * CP_STEP_OVERHEAD_S
    assert kv_b / bw > 0 and float(ev.time.cp_comm[0]) > overheads_only


def test_cp_comm_type_reaches_the_flags_and_a2a_needs_divisible_heads(runner, in_tmp):
    text = (
        (EXAMPLES / "llama3-8b.yaml").read_text().replace("  precision: bf16", "  precision: bf16\n  cp_comm_type: a2a")
    )
    (in_tmp / "s.yaml").write_text(text)
    out = in_tmp / "p"
    args = [
        "plan",
        str(in_tmp / "s.yaml"),
        "--cluster",
        "dgx16",
        "--nodes",
        "1",
        "--runtime",
        "megatron",
        "--tp",
        "2",
        "--pp",
        "1",
        "--cp",
        "4",
        "--out",
        str(out),
    ]
    r = runner.invoke(main, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    flags = dict(parse_args_lines((out / "megatron_args.txt").read_text()))
    assert flags["--cp-comm-type"] == "a2a" and flags["--context-parallel-size"] == "4"
    model, training = _spec(cp_comm_type="a2a")
    # tp 8 (one node) x cp 2 is 16 GPUs: on two nodes, 1 kv head per tp rank cannot split over cp 2.
    two = load_profile("dgx16").profile.resized(nodes=2)
    L2 = _layout(tp=8, recompute="full", cp=2)
    msgs = check_layout(L2, model, training, two, "megatron")
    assert any("cp_comm_type a2a" in m and "key/value heads" in m for m in msgs), msgs
    assert check_layout(L2, model, training.model_copy(update={"cp_comm_type": "p2p"}), two, "megatron") == []


def test_hierarchical_a2a_p2p_is_a2a_inside_a_node_and_the_ring_across():
    """a2a+p2p on two nodes, tp 2 x cp 8: all-to-alls among the 4 cp ranks of a node (NVLink), the p2p
    ring over the 2 nodes (the GPU's share of the NICs), each with the bytes of this rank's chunks."""
    model, training = _spec(cp_comm_type="a2a+p2p")
    profile = load_profile("dgx16").profile.resized(nodes=2)
    L = _layout(tp=2, cp=8)
    assert check_layout(L, model, training, profile, "megatron") == []
    ev = evaluate(model, training, profile, "megatron", candidates_of(model, [L]))
    assert float(ev.time.cp_comm[0]) == pytest.approx(_hand(model, training, profile, L, "a2a+p2p"), rel=1e-9)
    # On one node there is no ring to build: refused, pointing at a2a or p2p.
    one = dataclasses.replace(L, cp=4)
    msgs = check_layout(one, model, training, _one_node(), "megatron")
    assert any("a2a+p2p needs the cp ranks to span NVLink domains" in m for m in msgs), msgs


def test_hierarchical_sizes_reach_the_flags(runner, in_tmp):
    text = (
        (EXAMPLES / "llama3-8b.yaml")
        .read_text()
        .replace("  precision: bf16", "  precision: bf16\n  cp_comm_type: a2a+p2p")
    )
    (in_tmp / "s.yaml").write_text(text)
    out = in_tmp / "p"
    r = runner.invoke(
        main,
        [
            "plan",
            str(in_tmp / "s.yaml"),
            "--cluster",
            "dgx16",
            "--nodes",
            "2",
            "--runtime",
            "megatron",
            "--tp",
            "2",
            "--pp",
            "1",
            "--cp",
            "8",
            "--out",
            str(out),
        ],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    flags = parse_args_lines((out / "megatron_args.txt").read_text())
    d = dict(flags)
    assert d["--cp-comm-type"] == "a2a+p2p" and d["--hierarchical-context-parallel-sizes"] == "4 2"
    assert check_megatron_args(flags, 16) == []
