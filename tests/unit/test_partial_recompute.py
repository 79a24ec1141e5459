"""Partial recomputation (layout axis recompute_layers): Megatron-LM's --recompute-method block
--recompute-num-layers N reruns the first N layers of each (virtual) pipeline stage and lets the
others keep their activations (core/recompute.py). Counted in memory and time between none and
full, rendered as Megatron flags, refused at the command line (its rules are test_rules.py's, its
search test_solver.py's)."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.cli.main import main
from orchestrator.costmodel import evaluate
from orchestrator.plan.layout import Layout
from orchestrator.plan.rules import stage_split
from orchestrator.plan.solver import candidates_of
from orchestrator.spec.cluster import load_profile
from orchestrator.spec.model import load_spec
from orchestrator.validate.megatron import check_megatron_args, parse_args_lines

from ..conftest import EXAMPLES

# Meta's Llama 3 405B layout on 32 x 8 H100 (tp8 pp16, 8 layers a stage, 126 + 2 split edge-light).
META = Layout(tp=8, sequence_parallel=True, pp=16, vpp=1, dp=2, zero_stage=1, micro_batch_size=1,
              grad_accum_steps=1024, recompute="full", cp=1)


def _spec(name="llama3-405b.yaml"):
    spec, _ = load_spec(EXAMPLES / name)
    return spec.model, spec.training


def _profile(nodes=32):
    return load_profile("dgx16").profile.resized(nodes=nodes)


def _eval(model, training, profile, layouts, runtime="megatron"):
    return evaluate(model, training, profile, runtime, candidates_of(model, layouts))


def test_memory_and_time_lie_between_none_and_full_in_proportion():
    """With N of a stage's L layers recomputed, the activations kept are N full-recompute layers and
    L - N whole layers (the backward's working set is the same), and the recomputation is N layers'
    forward: both exactly the share N/L of the way from none to full."""
    model, training = _spec()
    profile = _profile()
    split = stage_split(model.num_layers, 16)
    layers = max(split.first, split.middle, split.last)
    n = 3
    none, full, part = (dataclasses.replace(META, recompute=rc, recompute_layers=k)
                        for rc, k in (("none", 0), ("full", 0), ("full", n)))
    ev = _eval(model, training, profile, [none, full, part])
    act, comp, tp = ev.memory.activations, ev.time.compute, ev.tp_comm_total
    share = n / layers
    assert float(act[2]) == pytest.approx(float(act[1]) + (1 - share) * float(act[0] - act[1]), rel=1e-12)
    assert float(comp[2]) == pytest.approx(float(comp[0]) + share * float(comp[1] - comp[0]), rel=1e-12)
    # Full recomputation also reruns the forward's TP collectives: 4 + 2 N/L per layer, not 6.
    assert float(tp[2]) == pytest.approx(float(tp[0]) * (4 + 2 * share) / 4, rel=1e-12)
    assert float(act[1]) < float(act[2]) < float(act[0]) and float(comp[0]) < float(comp[2]) < float(comp[1])


def test_interleaving_recomputes_n_layers_of_every_virtual_stage():
    model, training = _spec()
    profile = _profile()
    v2 = dataclasses.replace(META, vpp=2, recompute_layers=2)  # 2 of each 4-layer virtual stage
    v1 = dataclasses.replace(META, vpp=2, recompute_layers=0)
    none = dataclasses.replace(META, vpp=2, recompute="none")
    ev = _eval(model, training, profile, [v1, v2, none])
    comp = ev.time.compute
    assert float(comp[1]) == pytest.approx(float(comp[2]) + 0.5 * float(comp[0] - comp[2]), rel=1e-12)


def test_rendered_as_megatron_block_flags(runner, in_tmp):
    out = in_tmp / "p"
    r = runner.invoke(
        main,
        ["plan", str(EXAMPLES / "llama3-405b.yaml"), "--cluster", "dgx16", "--nodes", "32", "--runtime", "megatron",
         "--tp", "8", "--pp", "16", "--vpp", "1", "--cp", "1", "--recompute", "full", "--recompute-layers", "5",
         "--out", str(out)],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    flags = parse_args_lines((out / "megatron_args.txt").read_text())
    d = dict(flags)
    assert (d["--recompute-granularity"], d["--recompute-method"], d["--recompute-num-layers"]) == ("full", "block", "5")
    assert check_megatron_args(flags, 256) == []
    assert "rc=full/5" in r.output


def test_a_pin_the_runtime_cannot_run_says_why(runner):
    r = runner.invoke(
        main,
        ["plan", str(EXAMPLES / "llama3-8b.yaml"), "--cluster", "dgx16", "--nodes", "1", "--recompute-layers", "3",
         "--no-write"],
        catch_exceptions=False,
    )
    assert r.exit_code == 2 and "bundled DeepSpeed entrypoint checkpoints every decoder layer" in r.output, r.output
