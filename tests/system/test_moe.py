"""Mixture-of-experts training in the bundled entrypoint (train/model/moe.py): routing against its
definitions, and real DeepSpeed ranks on CPU over gloo training a tiny MoE model with expert
parallelism to the single-process run's losses, gradient norms and final weights.

The model: examples/tiny.yaml's with 4 experts (top 2, SwiGLU of 32) and one shared expert in
layers 1-3 (layer 0 dense), QK-norm and an explicit head width (kv_channels 32 on hidden 64). All
runs take micro-batches of 4 sequences, so that every layout routes the same micro-batches: the
auxiliary loss is per micro-batch (train/model/moe.py), and a micro-batch of another size is another
loss. Equal up to the order of floating-point sums, as the dense layouts of test_train.py; 1e-5
relative, the same tolerance and reasons. What is compared after 6 steps: each step's loss and
gradient norm, and every weight, joined from the ranks' shards (``--dump-weights``,
train/model/gather.py) and named as in one process; a name several ranks hold (replicas, tp peers)
must be equal on each.

Layouts: ep 2 x dp 2 at ZeRO-2 (2 ranks), ep 2 x tp 2 (sequence parallel, ZeRO-1) and ep 2 x pp 2
(DeepSpeed's pipeline engine, two micro-batches in flight, ZeRO-1) on 4 ranks, and the ep 2 x pp 2
run stopped and resumed. About 80 s on 2 cores.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner

from orchestrator.cli.main import main
from orchestrator.spec.model import ModelSpec, MoESpec, SpecFile

from .test_train import ROOT, losses, metrics, train

TINY = ROOT / "examples" / "tiny.yaml"
STEPS = 6
RTOL = 1e-5
MOE = {"num_experts": 4, "top_k": 2, "ffn_hidden_size": 32, "shared_experts": 1, "dense_leading_layers": 1}


def moe_spec_doc(**moe) -> dict:
    doc = yaml.safe_load(TINY.read_text())
    doc["name"] = "tiny-moe"
    doc["model"].update(qk_norm=True, kv_channels=32, moe={**MOE, **moe})
    return doc


def plan_moe(out: Path, doc: dict, *pins: str) -> Path:
    spec = out.parent / f"{out.name}.yaml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(yaml.safe_dump(doc))
    r = CliRunner().invoke(main, ["plan", str(spec), "--cluster", "local", "--out", str(out), "--mbs", "4", *pins],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return out


# name -> (ranks, pins, expected layout)
LAYOUTS = {
    "ep2-dp2-zero2": (2, ["--gpus-per-node", "2", "--dp", "2", "--ep", "2", "--zero", "2"],
                      dict(dp=2, ep=2, etp=1, zero_stage=2)),
    "ep2-tp2-sp": (4, ["--tp", "2", "--pp", "1", "--dp", "2", "--ep", "2", "--zero", "1", "--sp"],
                   dict(tp=2, dp=2, ep=2, etp=2, sequence_parallel=True)),
    "ep2-pp2": (4, ["--tp", "1", "--pp", "2", "--dp", "2", "--ep", "2", "--zero", "1"],
                dict(pp=2, dp=2, ep=2, grad_accum_steps=2)),
}


def weights(dump: Path) -> dict[str, torch.Tensor]:
    """The union of the ranks' dumps; a tensor held by several ranks must be the same on each."""
    out: dict[str, torch.Tensor] = {}
    for f in sorted(dump.glob("weights-rank*.pt")):
        for name, t in torch.load(f).items():
            if name in out:
                assert torch.allclose(out[name], t, rtol=RTOL, atol=1e-7), f"{name} differs between ranks ({f.name})"
            out[name] = t
    return out


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    d = tmp_path_factory.mktemp("moe-single")
    # ZeRO-1: its engine reports the gradient norm (the torch optimizer of ZeRO-0 does not).
    plan_dir = plan_moe(d / "plan", moe_spec_doc(), "--gpus-per-node", "1", "--zero", "1")
    train(plan_dir, 1, d / "run", "--no-save", "--steps", str(STEPS), "--dump-weights", str(d / "weights"))
    got = metrics(d / "run")
    assert len(got) == STEPS and abs(got[1]["loss"] - math.log(256)) < 0.05
    return plan_dir, got, weights(d / "weights")


@pytest.fixture(scope="module")
def moe_runs(tmp_path_factory):
    cache: dict[str, tuple] = {}

    def get(name):
        if name not in cache:
            nproc, pins, expected = LAYOUTS[name]
            d = tmp_path_factory.mktemp(name)
            plan_dir = plan_moe(d / "plan", moe_spec_doc(), *pins)
            layout = yaml.safe_load((plan_dir / "plan.yaml").read_text())["layout"]
            assert {k: layout[k] for k in expected} == expected
            p = train(plan_dir, nproc, d / "run", "--no-save", "--steps", str(STEPS), "--dump-weights",
                      str(d / "weights"))
            cache[name] = (plan_dir, metrics(d / "run"), weights(d / "weights"), p.stdout)
        return cache[name]

    return get


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_expert_parallel_layout_matches_single_process(name, single, moe_runs):
    _, ref, ref_weights = single
    _, got, got_weights, stdout = moe_runs(name)
    assert "(ep 2: experts over 2 dp ranks" in stdout
    assert [got[s]["loss"] for s in sorted(got)] == pytest.approx([ref[s]["loss"] for s in sorted(ref)], rel=RTOL)
    assert [got[s]["grad_norm"] for s in sorted(got)] == pytest.approx(
        [ref[s]["grad_norm"] for s in sorted(ref)], rel=RTOL)
    assert sorted(got_weights) == sorted(ref_weights)
    # pytest -s shows how close: the largest relative loss gap and absolute weight gap.
    loss_gap = max(abs(got[s]["loss"] / ref[s]["loss"] - 1) for s in ref)
    weight_gap = max(float((got_weights[k] - w).abs().max()) for k, w in ref_weights.items())
    print(f"\n{name}: largest relative loss gap {loss_gap:.1e}, largest weight gap {weight_gap:.1e}")
    for k, w in ref_weights.items():
        assert torch.allclose(got_weights[k], w, rtol=RTOL, atol=1e-6), (name, k, (got_weights[k] - w).abs().max())


def test_the_experts_trained(single):
    """Every routed expert of every MoE layer received tokens and moved from its initial weights."""
    plan_dir, _, final = single
    from orchestrator.plan.layout import Layout
    from orchestrator.train.model.decoder import layer_specs
    from orchestrator.train.model.tensor_parallel import TPContext

    spec = SpecFile.model_validate(moe_spec_doc())
    lay = Layout(tp=1, pp=1, dp=1, vpp=1, zero_stage=1, micro_batch_size=4, grad_accum_steps=4, recompute="none",
                 sequence_parallel=False)
    initial = {}
    for i, s in enumerate(layer_specs(spec.model, 64, lay, TPContext(None, False), spec.training.seed)):
        initial.update({f"layers.{i}.{k}": p for k, p in s.build().named_parameters()})
    assert sum(p.numel() for p in initial.values()) == spec.model.num_params
    experts = [k for k in final if ".deepspeed_experts." in k]
    assert len(experts) == 3 * 4 * 2  # 3 MoE layers, 4 experts, gate/up and down
    for k in experts:
        assert not torch.allclose(final[k], initial[k]), k


def test_an_expert_parallel_run_resumes_exactly(tmp_path, moe_runs):
    """ep 2 x pp 2 stopped after step 3 and resumed: DeepSpeed's MoE checkpoint (one file per
    expert and layer, written by the first rank of each expert data-parallel group) brings back
    each rank's own experts; the losses are the uninterrupted run's, exactly."""
    plan_dir, uninterrupted, _, _ = moe_runs("ep2-pp2")
    run = tmp_path / "run"
    train(plan_dir, 4, run, "--steps", "3")
    step3 = run / "checkpoints" / "step00000003"
    names = sorted(p.name for p in step3.glob("layer_*_expert_*"))
    # Stage 0 holds decoder layer 1 (MoE), stage 1 layers 2 and 3: per stage its MoE layers from 0.
    assert names == sorted(f"layer_{layer}_expert_{e}_mp_rank_{stage:02d}_model_states.pt"
                           for stage, layers in ((0, 1), (1, 2)) for layer in range(layers) for e in range(4))
    p = train(plan_dir, 4, run, "--steps", str(STEPS))
    assert "resumed from" in p.stdout
    assert losses(run) == [uninterrupted[s]["loss"] for s in sorted(uninterrupted)]


# --------------------------------------------------------------------------- routing, in one process


def _moe(**kw) -> MoESpec:
    return MoESpec(**{"num_experts": 4, "top_k": 2, "ffn_hidden_size": 8, **kw})


def test_softmax_top_k_renormalised_is_the_softmax_of_the_top_k_logits():
    from orchestrator.train.model.moe import route

    logits = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    r = route(logits, _moe(), 2, None)
    top = logits.topk(2, dim=-1)
    assert torch.equal(r.experts, top.indices)
    assert torch.allclose(r.probs, torch.softmax(top.values, dim=-1), atol=1e-7)
    raw = route(logits, _moe(norm_top_k=False, scale=2.0), 2, None)
    assert torch.allclose(raw.probs, 2.0 * torch.softmax(logits, dim=-1).gather(1, top.indices))
    sig = route(logits, _moe(router="sigmoid"), 2, None)
    s = torch.sigmoid(logits).gather(1, top.indices)
    assert torch.allclose(sig.probs, s / s.sum(-1, keepdim=True))


def test_grouped_top_k_chooses_within_the_best_groups():
    """8 experts in 4 groups, the best 2 groups (by the sum of their best top_k / group_top_k = 1
    score) supply the top 2: expert 7 scores second overall but its group is only third."""
    from orchestrator.train.model.moe import route

    logits = torch.tensor([[5.0, 0.0, 4.0, 0.0, 0.0, 0.0, 0.0, 4.5]]).repeat(2, 1)
    logits[:, 1] = 4.9  # group 0 = {0, 1}: best 5.0; group 1 = {2, 3}: 4.0; group 3 = {6, 7}: 4.5
    plain = route(logits, _moe(num_experts=8), 1, None)
    assert plain.experts[0].tolist() == [0, 1]
    logits[:, 1] = 0.0
    plain = route(logits, _moe(num_experts=8), 1, None)
    assert plain.experts[0].tolist() == [0, 7]
    grouped = route(logits, _moe(num_experts=8, groups=4, group_top_k=2), 1, None)
    assert grouped.experts[0].tolist() == [0, 7]  # groups 0 and 3 are the best two: same
    grouped = route(logits, _moe(num_experts=8, groups=4, group_top_k=1, top_k=2), 1, None)
    assert sorted(grouped.experts[0].tolist()) == [0, 1]  # only group 0: its two experts


def test_the_capacity_keeps_each_experts_most_probable_routes():
    from orchestrator.train.model.moe import route

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(32, 4, generator=g)
    logits[:, 0] += 3.0  # expert 0 wanted by nearly every token
    r = route(logits, _moe(capacity_factor=1.0), 4, None)
    capacity = math.ceil(32 * 2 / 4 * 1.0)
    for e in range(4):
        chosen = r.experts == e
        kept = chosen & r.keep
        assert int(kept.sum()) == min(capacity, int(chosen.sum()))
        if int(chosen.sum()) > capacity:  # the kept ones are the most probable of those that chose e
            assert r.probs[kept].min() >= r.probs[chosen & ~r.keep].max()


def test_the_load_balancing_loss_is_switchs_and_its_gradient_enters_scaled():
    """aux = coeff E sum_i f_i P_i (Fedus et al. 2021, eq. 4-6, top-k as Megatron-LM): coeff for
    perfectly balanced routing; per sequence, the mean over sequences. Its gradient reaches the
    router logits multiplied by the scale the trainer sets (1 / gradient-accumulation steps)."""
    from orchestrator.train.model.moe import AuxLossScale, load_balancing_loss, route

    moe = _moe(aux_loss_coeff=0.1)
    even = torch.zeros(8, 4)
    experts = torch.tensor([[0, 1], [2, 3]] * 4)
    assert float(load_balancing_loss(torch.softmax(even, -1), experts, moe, 2)) == pytest.approx(0.1)
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(8, 4, generator=g, requires_grad=True)
    scores = torch.softmax(logits, -1)
    chosen = torch.zeros(8, 4).scatter_(1, scores.topk(2).indices, 1.0)
    expected = 0.1 * 4 * ((chosen.sum(0) / 16) * scores.mean(0)).sum()
    assert torch.allclose(load_balancing_loss(scores, scores.topk(2).indices, moe, 2), expected)
    per_seq = _moe(aux_loss_coeff=0.1, load_balancing="seq_aux_loss")
    seqs = [0.1 * 4 * ((chosen.view(4, 2, 4)[:, j].sum(0) / 8) * scores.view(4, 2, 4)[:, j].mean(0)).sum()
            for j in range(2)]
    assert torch.allclose(load_balancing_loss(scores, scores.topk(2).indices, per_seq, 2), sum(seqs) / 2)
    # The gradient: probs carry it; a loss that ignores them still trains the router through it.
    r = route(logits, moe, 2, AuxLossScale(0.25))
    (r.probs * 0).sum().backward()
    mine = logits.grad.clone()
    logits.grad = None
    (0.25 * load_balancing_loss(torch.softmax(logits, -1), r.experts, moe, 2)).backward()
    assert torch.allclose(mine, logits.grad, atol=1e-8)


def test_the_moe_layer_is_its_definition_token_by_token():
    """The sorted, batched dispatch of one process against a loop over tokens and their experts,
    forward and the router's gradient."""
    import torch.nn.functional as F

    from orchestrator.train.model.decoder import FeedForward
    from orchestrator.train.model.moe import EPContext, MoEFeedForward, route
    from orchestrator.train.model.tensor_parallel import TPContext

    model = ModelSpec(num_layers=2, hidden_size=16, ffn_hidden_size=32, num_attention_heads=2, vocab_size=64,
                      moe=_moe(shared_experts=1, shared_expert_gate=True, ffn_hidden_size=8, aux_loss_coeff=0.0))
    tp = TPContext(None, False)
    layer = MoEFeedForward(model, tp, EPContext(), 7, 0, lambda f, t, n: FeedForward(model, f, t, n, seed=7), None)
    x = torch.randn(5, 3, 16, generator=torch.Generator().manual_seed(3), requires_grad=True)
    y = layer(x)
    tokens = x.reshape(15, 16)
    r = route(F.linear(tokens, layer.router), model.moe, 3, None)
    ref = []
    for t in range(15):
        out = sum(r.probs[t, j] * layer.experts[int(r.experts[t, j])](tokens[t : t + 1])[0] for j in range(2))
        shared = layer.shared(tokens[t : t + 1])[0] * torch.sigmoid(tokens[t] @ layer.shared_gate[0])
        ref.append(out + shared)
    ref = torch.stack(ref).view(5, 3, 16)
    assert torch.allclose(y, ref, atol=1e-6)
    y.pow(2).sum().backward()
    mine = layer.router.grad.clone()
    layer.router.grad = None
    ref.pow(2).sum().backward()
    assert torch.allclose(mine, layer.router.grad, atol=1e-6)


# --------------------------------------------------------------------------- refusals and other layouts


def test_what_the_entrypoint_does_not_train_is_refused_in_one_paragraph(tmp_path):
    """Before any rank starts (`dsorch submit` and every rank load the plan through check_trainable):
    the spec keys the entrypoint has no layer for, each named, in one error."""
    from orchestrator.errors import InvalidFile
    from orchestrator.train.loop.config import load_plan

    doc = moe_spec_doc(expert_bias=True, router="sigmoid")  # Megatron-LM takes the bias with sigmoid scores only
    doc["model"].update(mtp_layers=1, attention_sinks=True)
    plan_dir = plan_moe(tmp_path / "plan", doc, "--gpus-per-node", "1")
    with pytest.raises(InvalidFile) as e:
        load_plan(plan_dir)
    msg = str(e.value)
    for key in ("model.mtp_layers 1", "model.attention_sinks", "model.moe.expert_bias", "--runtime megatron"):
        assert key in msg, msg
    assert msg.count("\n") == 0


def test_expert_layouts_the_entrypoint_cannot_train_are_named():
    from orchestrator.plan.layout import Layout
    from orchestrator.train.loop.config import expert_layout_problems

    model = SpecFile.model_validate(moe_spec_doc()).model

    def lay(**kw):
        base = dict(tp=1, pp=1, dp=4, vpp=1, zero_stage=1, micro_batch_size=4, grad_accum_steps=1, recompute="none",
                    sequence_parallel=False, ep=2, etp=1)
        return Layout(**{**base, **kw})

    assert expert_layout_problems(model, lay()) == []
    assert "ZeRO-3 with ep 2" in expert_layout_problems(model, lay(zero_stage=3))[0]
    assert "ZeRO-0 with ep 2" in expert_layout_problems(model, lay(zero_stage=0))[0]
    assert "does not divide dp 2" in " ".join(expert_layout_problems(model, lay(dp=2, ep=4)))
    assert "does not divide the 4 experts" in expert_layout_problems(model, lay(dp=6, ep=3))[0]
    assert "etp 1 differs from tp 2" in expert_layout_problems(model, lay(tp=2))[0]
    assert expert_layout_problems(model, lay(zero_stage=0, ep=1)) == []  # ep 1: the experts are dense params


def test_a_moe_trial_is_an_ordinary_plan_directory_the_entrypoint_takes(tmp_path):
    """`dsorch trial` makes each pick a plan directory and runs the entrypoint on it: an expert
    parallel pick is one, the entrypoint's checks accept it, and a run of it is measured."""
    import json

    from orchestrator.plan.layout import Pins
    from orchestrator.plan.solver import search
    from orchestrator.plandir.writer import write_plan_dir
    from orchestrator.run.trial import entry_of, measure, select_trials, trial_plans
    from orchestrator.spec.cluster import load_profile
    from orchestrator.spec.model import load_spec
    from orchestrator.train.loop.config import load_plan

    spec_path = tmp_path / "tiny-moe.yaml"
    spec_path.write_text(yaml.safe_dump(moe_spec_doc()))
    spec, loaded_spec = load_spec(spec_path)
    loaded = load_profile("local")
    ranked = search(spec.model, spec.training, loaded.profile, "deepspeed", Pins(ep=2, dp=4, zero_stage=1),
                    keep=100).ranked
    picks = select_trials(ranked, 1)
    assert picks[0].scored.layout.ep == 2
    (d, files), = trial_plans(spec, spec_path, loaded_spec.sha256, loaded, "deepspeed", picks[:1], tmp_path / "t")
    write_plan_dir(d, files)
    assert load_plan(d).layout == picks[0].scored.layout
    run = d / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "loss": 5.0, "step_time_s": 0.5,
                                                           "peak_mem_gib": 0.4}) + "\n" for i in range(1, 7)))
    res = measure(entry_of(0, picks[0], "1_0"), d, run, "COMPLETED")
    assert res.failure is None and res.measured_step_s == 0.5
