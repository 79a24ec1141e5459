"""Megatron-Core's parallelism and engine options: context parallelism, FP8, uneven interleaved
pipelines, Megatron-FSDP, TP and p2p overlap, the DP bucket rule. Each is searched (or applied) by the planner, priced by the cost
model, emitted as Megatron-LM flags and checked by dsorch's Megatron validation (tests/system/test_megatron_lm.py
runs Megatron-LM's own parser and validate_args on the same examples)."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
import yaml

from orchestrator.cli.main import main
from orchestrator.costmodel import evaluate
from orchestrator.runtimes.megatron import MEGATRON_BUCKET_ELEMENTS, MEGATRON_BUCKET_PER_DP
from orchestrator.plan.layout import Layout
from orchestrator.plan.layout import Pins
from orchestrator.plan.solver import candidates_of, enumerate_layouts, search
from orchestrator.spec.cluster import load_profile
from orchestrator.spec.model import load_spec
from orchestrator.validate.megatron import check_megatron_args, parse_args_lines
from orchestrator.validate.plan_dir import validate_path

from ..conftest import EXAMPLES


def plan(runner, *args):
    return runner.invoke(main, ["plan", *map(str, args)], catch_exceptions=False)


def _flags(out):
    return parse_args_lines((out / "megatron_args.txt").read_text())


def _doc(out):
    return yaml.safe_load((out / "plan.yaml").read_text())


def _spec_of(path):
    spec, _ = load_spec(path)
    return spec.model, spec.training


# ---- context parallelism
def test_long_context_plans_with_context_parallelism(runner, in_tmp):
    out = in_tmp / "p"
    r = plan(runner, "examples/llama3-70b-128k.yaml", "--cluster", "dgx16", "--runtime", "megatron", "--out", out)
    assert r.exit_code == 0, r.output
    doc = _doc(out)
    cp = doc["layout"]["cp"]
    assert cp > 1  # 128K tokens do not fit on 16 nodes without splitting the sequence
    flags = dict(_flags(out))
    assert flags["--context-parallel-size"] == str(cp) and flags["--cp-comm-type"] == "p2p"
    assert flags["--transformer-impl"] == "transformer_engine"
    assert check_megatron_args(_flags(out), doc["cluster"]["world_size"]) == []
    assert validate_path(out) == []
    assert "cp_comm" in doc["time_breakdown_s"]
    # Beyond the runs the Megatron entry was fitted on (all cp 1): no interval, and it says why.
    assert doc["predicted"]["step_time_interval"] is None and "cp " in doc["predicted"]["confidence"]


def test_context_parallelism_is_refused_where_it_cannot_run(runner, in_tmp):
    r = plan(runner, "examples/llama3-70b-128k.yaml", "--cluster", "dgx16", "--cp", "2", "--no-write")
    assert r.exit_code == 2 and "context parallelism (ring attention) is a Megatron-LM feature" in r.output
    text = (EXAMPLES / "llama3-70b.yaml").read_text().replace("seq_length: 8192", "seq_length: 6000")
    (in_tmp / "s.yaml").write_text(text)
    r = plan(runner, in_tmp / "s.yaml", "--cluster", "dgx16", "--runtime", "megatron", "--cp", "16", "--no-write")
    assert r.exit_code == 2 and "seq_length 6000 is not a multiple of 2 x cp = 32" in r.output, r.output
    c, _ = enumerate_layouts(*_spec_of(in_tmp / "s.yaml"), load_profile("dgx16").profile, "megatron")
    assert set(np.unique(c.cp)) == {1, 2, 4, 8}  # 6000 splits into 2 x cp chunks for these only


def test_context_parallelism_splits_activations_and_prices_the_ring():
    spec, _ = load_spec(EXAMPLES / "llama3-70b-128k.yaml")
    profile = load_profile("dgx16").profile
    pins = dict(tp=8, pp=2, vpp=1, zero_stage=1, micro_batch_size=1, recompute="none", sequence_parallel=True)
    ev = {}
    for cp in (1, 2, 8):
        c, _ = enumerate_layouts(spec.model, spec.training, profile, "megatron", Pins(cp=cp, **pins))
        assert len(c) == 1 and int(c.cp[0]) == cp and int(c.dp[0]) == 128 // (8 * 2 * cp)
        ev[cp] = evaluate(spec.model, spec.training, profile, "megatron", c)
    # Every layer's saved activations and the loss are per token: cp 2 holds half of cp 1 (same
    # micro-batches in flight, gas is the same because dp halves as cp doubles ... at mbs 1).
    per_mb = {cp: float(ev[cp].memory.activations[0]) for cp in ev}
    assert per_mb[2] < 0.55 * per_mb[1] and per_mb[8] < 0.2 * per_mb[1]
    assert float(ev[1].time.cp_comm[0]) == 0.0
    # Ring attention at 128K hides behind attention inside a node (tp * cp = 64 spans nodes: IB).
    assert float(ev[8].time.cp_comm[0]) >= 0.0
    # The DP reduction runs over dp x cp ranks: the same group size at every cp here.
    assert all(float(ev[cp].dp_comm_total[0]) > 0 for cp in ev)


# ---- FP8
def test_fp8_plans_faster_with_its_flags(runner, in_tmp):
    out = in_tmp / "p"
    r = plan(runner, "examples/llama3-70b-fp8.yaml", "--cluster", "dgx16", "--runtime", "megatron", "--out", out)
    assert r.exit_code == 0, r.output
    doc = _doc(out)
    flags = dict(_flags(out))
    assert flags["--fp8-format"] == "hybrid" and flags["--transformer-impl"] == "transformer_engine"
    assert "--bf16" in flags and "--fp8-amax-history-len" in flags
    L = doc["layout"]
    assert ("--tp-comm-overlap" in flags) == (L["tp"] > 1 and L["sequence_parallel"])
    assert check_megatron_args(_flags(out), doc["cluster"]["world_size"]) == []
    assert doc["predicted"]["step_time_interval"] is None and "FP8" in doc["predicted"]["confidence"]
    # The same layout in bf16 is slower and holds more activations.
    spec8, _ = load_spec(EXAMPLES / "llama3-70b-fp8.yaml")
    bf16 = spec8.training.model_copy(update={"fp8": None})
    profile = load_profile("dgx16").profile
    pins = Pins(**{k: L[k] for k in ("tp", "pp", "dp", "vpp", "cp", "micro_batch_size", "recompute")},
                zero_stage=L["zero_stage"], sequence_parallel=L["sequence_parallel"])
    c, _ = enumerate_layouts(spec8.model, spec8.training, profile, "megatron", pins)
    e8 = evaluate(spec8.model, spec8.training, profile, "megatron", c)
    e16 = evaluate(spec8.model, bf16, profile, "megatron", c)
    assert float(e8.time.compute[0]) < 0.85 * float(e16.time.compute[0])
    assert float(e8.memory.activations[0]) < float(e16.memory.activations[0])
    assert float(e8.mfu[0]) > float(e16.mfu[0])  # MFU against the bf16 peak for both


@pytest.mark.parametrize("args, text", [
    (["--cluster", "dgx16"], "training.fp8 'hybrid': FP8 GEMMs come from Transformer Engine under Megatron-LM"),
    (["--cluster", "dgx-a100-80gb-hdr", "--runtime", "megatron"], "states no FP8 peak for A100-SXM4-80GB"),
])
def test_fp8_is_refused_where_it_cannot_run(runner, in_tmp, args, text):
    r = plan(runner, "examples/llama3-70b-fp8.yaml", *args, "--out", in_tmp / "p")
    assert r.exit_code == 2 and text in r.output, r.output
    assert not (in_tmp / "p").exists()


@pytest.mark.parametrize("recipe, cluster, refused", [
    ("mxfp8", "dgx16", True),  # Hopper: TE's MXFP8 needs compute capability 10.0
    ("mxfp8", "gb300-nvl72", False),
    ("blockwise", "dgx16", False),
    ("blockwise", "gb200-nvl72", False),
])
def test_fp8_recipe_is_refused_on_gpus_transformer_engine_refuses_it(runner, in_tmp, recipe, cluster, refused):
    text = (EXAMPLES / "llama3-70b-fp8.yaml").read_text().replace("fp8: hybrid", f"fp8: hybrid\n  fp8_recipe: {recipe}")
    assert f"fp8_recipe: {recipe}" in text
    (in_tmp / "s.yaml").write_text(text)
    r = plan(runner, in_tmp / "s.yaml", "--cluster", cluster, "--runtime", "megatron", "--out", in_tmp / "p")
    assert (r.exit_code == 2) == refused, r.output
    if refused:
        assert f"training.fp8_recipe '{recipe}' on " in r.output and "compute_capability 9.0" in r.output
        assert not (in_tmp / "p").exists()
    else:
        assert dict(_flags(in_tmp / "p"))["--fp8-recipe"] == recipe


def test_fp8_param_gather_keeps_fp8_weights_only(runner, in_tmp):
    """--fp8-param-gather (Megatron-Bridge's FP8 presets): the flag beside the distributed optimizer,
    accepted by dsorch's copy of Megatron-LM's argument rules; the FP8 cache of every layer weight
    is no longer counted on top of the bf16 one; the step time is the same."""
    text = (EXAMPLES / "llama3-70b-fp8.yaml").read_text().replace("fp8: hybrid", "fp8: hybrid\n  fp8_param_gather: true")
    assert "fp8_param_gather: true" in text
    (in_tmp / "s.yaml").write_text(text)
    r = plan(runner, in_tmp / "s.yaml", "--cluster", "dgx16", "--runtime", "megatron", "--out", in_tmp / "p")
    assert r.exit_code == 0, r.output
    doc, flags = _doc(in_tmp / "p"), _flags(in_tmp / "p")
    names = [f for f, _ in flags]
    assert "--fp8-param-gather" in names and "--use-distributed-optimizer" in names
    assert doc["layout"]["zero_stage"] == 1
    assert check_megatron_args(flags, doc["cluster"]["world_size"]) == []
    spec, _ = load_spec(in_tmp / "s.yaml")
    plain = spec.training.model_copy(update={"fp8_param_gather": False})
    profile = load_profile("dgx16").profile
    L = doc["layout"]
    pins = Pins(**{k: L[k] for k in ("tp", "pp", "dp", "vpp", "cp", "micro_batch_size", "recompute")},
                zero_stage=1, sequence_parallel=L["sequence_parallel"])
    c, _ = enumerate_layouts(spec.model, spec.training, profile, "megatron", pins)
    gather = evaluate(spec.model, spec.training, profile, "megatron", c)
    cached = evaluate(spec.model, plain, profile, "megatron", c)
    per_gpu = spec.model.num_params / (L["tp"] * L["pp"])
    saved = float(cached.memory.params[0] - gather.memory.params[0])
    assert 1.5 * per_gpu < saved < 2.0 * per_gpu  # 2 bytes per layer weight; embeddings and norms stay bf16
    assert float(gather.time.step[0]) == float(cached.time.step[0])
    for args, text in [(["--runtime", "megatron", "--zero", "0"], "zero_stage=0 with training.fp8_param_gather"),
                       (["--runtime", "deepspeed"], "training.fp8_param_gather is Megatron-LM's --fp8-param-gather")]:
        r = plan(runner, in_tmp / "s.yaml", "--cluster", "dgx16", *args, "--out", in_tmp / "q")
        assert r.exit_code == 2 and text in r.output, r.output
        assert not (in_tmp / "q").exists()


def test_fp8_needs_bf16(tmp_path):
    from orchestrator.errors import SpecError

    text = (EXAMPLES / "llama3-70b-fp8.yaml").read_text().replace("precision: bf16", "precision: fp16")
    (tmp_path / "s.yaml").write_text(text)
    with pytest.raises(SpecError, match="set training.precision to bf16"):
        load_spec(tmp_path / "s.yaml")


# ---- uneven pipeline stages, interleaved: Llama 3 405B's 16K-GPU layout (TP8 PP16)
def test_llama3_405b_uneven_interleaved_layout_is_expressible(runner, in_tmp):
    out = in_tmp / "p"
    r = plan(runner, "examples/llama3-405b.yaml", "--cluster", "dgx16", "--nodes", "2048", "--runtime", "megatron",
             "--tp", "8", "--pp", "16", "--vpp", "2", "--out", out)
    assert r.exit_code == 0, r.output
    doc = _doc(out)
    assert (doc["layout"]["tp"], doc["layout"]["pp"], doc["layout"]["vpp"]) == (8, 16, 2)
    flags = _flags(out)
    names = [f for f, _ in flags]
    # 126 layers over 16 stages: the embedding and the loss count as a layer each, 8 per rank, 4 per
    # virtual stage; the first chunk of the first rank and the last chunk of the last rank hold 3.
    assert "--account-for-embedding-in-pipeline-split" in names and "--account-for-loss-in-pipeline-split" in names
    assert dict(flags)["--num-layers-per-virtual-pipeline-stage"] == "4"
    assert "--decoder-first-pipeline-num-layers" not in names
    assert check_megatron_args(flags, doc["cluster"]["world_size"]) == []
    spec, _ = load_spec(EXAMPLES / "llama3-405b.yaml")
    c, _ = enumerate_layouts(spec.model, spec.training, load_profile("dgx16").profile.resized(nodes=2048), "megatron",
                             Pins(tp=8, pp=16))
    assert set(np.unique(c.vpp)) == {1, 2, 4, 8}  # the divisors of (126 + 2) / 16


def test_llama3_405b_as_meta_trained_it_fits():
    """Meta's layout (TP8 PP16 DP128, interleaved, 8K, mbs 1, no recomputation, 80 GB H100s) with
    its gradients sharded as Meta's FSDP sharded them (Llama 3 paper, Sec. 3.3.2): Megatron-FSDP
    optim_grads, zero_stage 2, fits. On Megatron's distributed optimizer (zero_stage 1), which keeps
    the whole fp32 gradient buffer, the same layout does not, by about that buffer."""
    spec, _ = load_spec(EXAMPLES / "llama3-405b.yaml")
    profile = load_profile("dgx16").profile.resized(nodes=2048)
    base = dict(tp=8, pp=16, dp=128, cp=1, vpp=2, micro_batch_size=1, recompute="none", sequence_parallel=True)
    fsdp = search(spec.model, spec.training, profile, "megatron", Pins(zero_stage=2, **base)).best
    assert fsdp is not None and fsdp.fits and fsdp.memory_gib["total"] < 80
    dist = search(spec.model, spec.training, profile, "megatron", Pins(zero_stage=1, **base))
    assert dist.best is None
    d = dist.closest[0].memory_gib
    assert d["grads"] == pytest.approx(2 * d["params"], rel=1e-6)  # fp32 main gradients, whole
    assert fsdp.memory_gib["grads"] == pytest.approx(d["grads"] / 128, rel=1e-6)  # sharded over dp
    assert d["total"] - fsdp.memory_gib["total"] > d["grads"] * 0.8
    assert fsdp.memory_gib["activations"] == d["activations"]
    # Beyond anything the Megatron entry was fitted on: it says so instead of giving an interval.
    assert fsdp.interval is None and "Megatron-FSDP" in fsdp.basis
    # With the sequence split in two (cp 2) the distributed optimizer fits too.
    res2 = search(spec.model, spec.training, profile, "megatron", Pins(tp=8, pp=16, cp=2, recompute="none"))
    assert res2.best is not None and res2.best.memory_gib["total"] < 70


def test_a_megatron_plan_that_fits_only_on_megatron_fsdp_says_so(runner, in_tmp):
    """Megatron-FSDP is searched only when pinned; when nothing else fits and it would, the error
    names the pin and the layout it gives."""
    args = ["examples/llama3-405b.yaml", "--cluster", "dgx16", "--nodes", "2048", "--runtime", "megatron",
            "--tp", "8", "--pp", "16", "--vpp", "2", "--cp", "1", "--recompute", "none", "--no-write"]
    r = plan(runner, *args)
    assert r.exit_code == 2 and "does not fit" in r.output
    hint = re.search(r"With Megatron-FSDP's sharded gradients \(--zero 2, searched only when pinned\) (.+?) fits at "
                     r"([\d.]+) GiB per GPU", r.output)
    assert hint, r.output
    pinned = plan(runner, *args, "--zero", "2", "--json")
    assert pinned.exit_code == 0, pinned.output
    assert hint.group(1) == Layout(**json.loads(pinned.output)["layout"]).short()
    # No hint where the pin would not help: the same model on a tenth of the nodes.
    r = plan(runner, *args[:4], "256", *args[5:])
    assert r.exit_code == 2 and "Megatron-FSDP" not in r.output


def test_megatron_fsdp_plan_flags_and_launch(runner, in_tmp):
    """zero_stage 2 on Megatron-LM is Megatron-FSDP: its flags, the checkpoint format it needs, no
    CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron-FSDP asserts it unset) and so no TP overlap; searched
    only when pinned."""
    out = in_tmp / "p"
    r = plan(runner, "examples/llama3-405b.yaml", "--cluster", "dgx16", "--nodes", "2048", "--runtime", "megatron",
             "--tp", "8", "--pp", "16", "--vpp", "2", "--recompute", "none", "--zero", "2", "--out", out)
    assert r.exit_code == 0, r.output
    doc = _doc(out)
    assert doc["layout"]["zero_stage"] == 2
    flags = _flags(out)
    d = dict(flags)
    assert "--use-megatron-fsdp" in d and "--use-distributed-optimizer" in d
    assert d["--data-parallel-sharding-strategy"] == "optim_grads" and d["--ckpt-format"] == "fsdp_dtensor"
    assert check_megatron_args(flags, doc["cluster"]["world_size"]) == []
    assert validate_path(out) == []
    launch = (out / "launch.sh").read_text()
    assert "export CUDA_DEVICE_MAX_CONNECTIONS" not in launch and "unset CUDA_DEVICE_MAX_CONNECTIONS" in launch
    # Without the pin the search keeps to the distributed optimizer.
    free = in_tmp / "q"
    assert plan(runner, "examples/llama3-405b.yaml", "--cluster", "dgx16", "--nodes", "2048", "--runtime",
                "megatron", "--tp", "8", "--pp", "16", "--out", free).exit_code == 0
    assert _doc(free)["layout"]["zero_stage"] in (0, 1)
    # dsorch's validation knows Megatron's rules for it.
    bad = [(f, v) for f, v in flags if f != "--ckpt-format"]
    assert any("fsdp_dtensor" in e for e in check_megatron_args(bad, doc["cluster"]["world_size"]))
    # TP overlap asked for by the spec is not applied on Megatron-FSDP.
    fp8 = in_tmp / "fp8"
    r = plan(runner, "examples/llama3-70b-fp8.yaml", "--cluster", "dgx16", "--runtime", "megatron", "--zero", "2",
             "--pp", "1", "--out", fp8)
    assert r.exit_code == 0, r.output
    names = [f for f, _ in _flags(fp8)]
    assert "--use-megatron-fsdp" in names and "--tp-comm-overlap" not in names


@pytest.mark.parametrize("pp,v", [(2, 1), (4, 1), (8, 1), (4, 2), (4, 4), (8, 2), (3, 3)])
def test_in_flight_micro_batches_are_the_schedules(pp, v):
    """The memory model's micro-batches in flight per stage against the schedule dsorch draws (1F1B and
    Megatron's interleaved order, cli/plot_schedule.py): the largest number of chunks whose forward has
    run and backward has not, in whole-stage units, for few and many micro-batches."""
    from orchestrator.costmodel.memory import in_flight_micro_batches
    from orchestrator.cli.plot_schedule import schedule

    for m in (pp, 2 * pp, 4 * pp):
        blocks = schedule(pp, m, v, 1.0, 2.0, 0.0)
        for stage in range(pp):
            live = peak = 0
            for b in sorted((b for b in blocks if b.stage == stage), key=lambda b: b.start):
                live += 1 if b.kind == "F" else -1
                peak = max(peak, live)
            assert float(in_flight_micro_batches(pp, v, m, stage)) == pytest.approx(peak / v), (m, stage)


# ---- TP communication overlap and overlapped sends
def test_tp_comm_overlap_applies_with_sequence_parallelism_only(runner, in_tmp):
    spec, _ = load_spec(EXAMPLES / "llama3-70b-fp8.yaml")
    training = spec.training.model_copy(update={"fp8": None})
    profile = load_profile("dgx16").profile
    base = dict(tp=8, pp=4, dp=4, vpp=1, cp=1, zero_stage=1, micro_batch_size=1, recompute="none")
    on = Pins(sequence_parallel=True, **base)
    off = Pins(sequence_parallel=False, **base)
    plain = training.model_copy(update={"tp_comm_overlap": False})
    t = {}
    for name, tr in (("overlap", training), ("plain", plain)):
        for sp_name, pins in (("sp", on), ("nosp", off)):
            c, _ = enumerate_layouts(spec.model, tr, profile, "megatron", pins)
            t[name, sp_name] = float(evaluate(spec.model, tr, profile, "megatron", c).time.tp_comm[0])
    assert t["overlap", "sp"] < t["plain", "sp"]
    assert t["overlap", "nosp"] == t["plain", "nosp"]
    r = plan(runner, "examples/llama3-70b-fp8.yaml", "--cluster", "dgx16", "--no-write")  # deepspeed runtime
    assert r.exit_code == 2 and "training.fp8" in r.output


def _tp_overlap_case(efficiency_tp_overlap, fp8=None):
    """Llama 3 70B at tp 8 with SP and --tp-comm-overlap on dgx16: (exposed TP seconds, total)."""
    from orchestrator.calibrate.rows import resolved_with
    from orchestrator.costmodel.calibration import resolve_efficiency

    spec, _ = load_spec(EXAMPLES / "llama3-70b-fp8.yaml")
    training = spec.training.model_copy(update={"fp8": fp8})
    profile = load_profile("dgx16").profile
    pins = Pins(tp=8, pp=4, dp=4, vpp=1, cp=1, zero_stage=1, micro_batch_size=1, recompute="none",
                sequence_parallel=True)
    c, _ = enumerate_layouts(spec.model, training, profile, "megatron", pins)
    values = resolve_efficiency(profile).values() | {"tp_overlap": efficiency_tp_overlap}
    ev = evaluate(spec.model, training, profile, "megatron", c, efficiency=resolved_with(values))
    return float(ev.time.tp_comm[0]), float(ev.tp_comm_total[0])


def test_userbuffers_hide_each_collective_behind_its_paired_gemm_only():
    """Transformer Engine's default userbuffers pair every TP collective with one GEMM: with no
    overlap at all, the five collectives of each TP block (AG + RS forward, AG x 2 + RS backward) are
    all exposed; however long the GEMMs, the last of the four pipelined reduce-scatter splits after
    each row-parallel GEMM stays exposed, so overlap never hides everything; FP8 all-gathers move
    half the bytes."""
    none, total = _tp_overlap_case(0.0)
    full, _ = _tp_overlap_case(1.0)
    assert none > total > 0  # 5 collectives per block exposed vs 4 before overlap (the re-gather for wgrad)
    assert 0 < full < 0.5 * none
    fp8_none, _ = _tp_overlap_case(0.0, fp8="hybrid")
    assert fp8_none < none  # the three all-gathers per block in FP8


def test_fp8_recipe_is_rendered_and_costs_its_casts(runner, in_tmp):
    """--fp8-recipe reaches Megatron-LM (delayed keeps its amax history flags); current scaling
    reads every quantized tensor once more for its amax than delayed scaling, so it costs more."""
    spec, _ = load_spec(EXAMPLES / "llama3-70b-fp8.yaml")
    profile = load_profile("dgx16").profile
    pins = Pins(tp=4, pp=8, dp=4, vpp=5, cp=1, zero_stage=1, micro_batch_size=1, recompute="none",
                sequence_parallel=True)
    c, _ = enumerate_layouts(spec.model, spec.training, profile, "megatron", pins)
    compute = {}
    for recipe in ("delayed", "tensorwise"):
        tr = spec.training.model_copy(update={"fp8_recipe": recipe})
        compute[recipe] = float(evaluate(spec.model, tr, profile, "megatron", c).time.compute[0])
    assert compute["tensorwise"] > compute["delayed"]
    text = (EXAMPLES / "llama3-70b-fp8.yaml").read_text().replace("  fp8: hybrid", "  fp8: hybrid\n  fp8_recipe: tensorwise")
    (in_tmp / "t.yaml").write_text(text)
    out = in_tmp / "p"
    r = plan(runner, in_tmp / "t.yaml", "--cluster", "dgx16", "--runtime", "megatron", "--out", out)
    assert r.exit_code == 0, r.output
    flags = dict(_flags(out))
    assert flags["--fp8-recipe"] == "tensorwise" and "--fp8-amax-history-len" not in flags
    assert check_megatron_args(_flags(out), _doc(out)["cluster"]["world_size"]) == []


def test_no_overlapped_sends_flag_and_cost(tmp_path, runner):
    spec, _ = load_spec(EXAMPLES / "llama3-70b.yaml")
    profile = load_profile("dgx16").profile
    pins = Pins(tp=8, pp=4, vpp=5, cp=1, micro_batch_size=1, zero_stage=1, recompute="none", sequence_parallel=True)
    c, _ = enumerate_layouts(spec.model, spec.training, profile, "megatron", pins)
    overlapped = float(evaluate(spec.model, spec.training, profile, "megatron", c).time.pp_comm[0])
    serial = spec.training.model_copy(update={"overlap_p2p_comm": False})
    exposed = float(evaluate(spec.model, serial, profile, "megatron", c).time.pp_comm[0])
    assert exposed > 5 * overlapped > 0
    # Serial: every chunk's send, m x vpp + pp - 1 of them; overlapped: only the warm-up's (and the
    # cool-down's), 2 (pp - 1) + (vpp - 1) pp chunks (schedules.py get_pp_rank_microbatches), at most
    # all m x vpp when the micro-batches are few. Each send costs the same either way.
    for gbs in (512, 16):
        few = spec.training.model_copy(update={"global_batch_size": gbs})
        c, _ = enumerate_layouts(spec.model, few, profile, "megatron", pins)
        m, pp, vpp = int(c.grad_accum_steps[0]), 4, 5
        ratio = float(evaluate(spec.model, few.model_copy(update={"overlap_p2p_comm": False}), profile, "megatron",
                               c).time.pp_comm[0]) / float(evaluate(spec.model, few, profile, "megatron", c).time.pp_comm[0])
        assert ratio == pytest.approx((m * vpp + pp - 1) / min(m * vpp, 2 * (pp - 1) + (vpp - 1) * pp), rel=1e-9), gbs
    text = (EXAMPLES / "llama3-70b.yaml").read_text().replace("  precision: bf16", "  precision: bf16\n  overlap_p2p_comm: false")
    (tmp_path / "s.yaml").write_text(text)
    out = tmp_path / "p"
    r = plan(runner, tmp_path / "s.yaml", "--cluster", "dgx16", "--runtime", "megatron", "--tp", "8", "--pp", "4",
             "--vpp", "5", "--cp", "1", "--out", out)
    assert r.exit_code == 0, r.output
    assert "--no-overlap-p2p-communication" in [f for f, _ in _flags(out)]
    assert check_megatron_args(_flags(out), _doc(out)["cluster"]["world_size"]) == []


# ---- Megatron's DP bucket rule
def test_megatron_dp_buckets_grow_with_the_dp_cp_group(monkeypatch):
    """Buckets of max(40M, 1M x dp x cp) elements: at dp 128 a 3.2B-parameter stage is 25 buckets, not 80,
    so the latency chain of the reduction shrinks accordingly."""
    spec, _ = load_spec(EXAMPLES / "llama3-405b.yaml")
    profile = load_profile("dgx16").profile.resized(nodes=2048)
    pins = Pins(tp=8, pp=16, dp=128, cp=1, vpp=1, micro_batch_size=1, recompute="full", sequence_parallel=True,
                zero_stage=1)
    c, _ = enumerate_layouts(spec.model, spec.training, profile, "megatron", pins)
    ev = evaluate(spec.model, spec.training, profile, "megatron", c)
    assert max(MEGATRON_BUCKET_ELEMENTS, MEGATRON_BUCKET_PER_DP * 128) == 128_000_000
    # Same layout with the old flat 40M rule: more buckets, more latency, all else equal.
    import importlib

    monkeypatch.setattr(importlib.import_module("orchestrator.runtimes.megatron"), "MEGATRON_BUCKET_PER_DP", 0)
    ev40 = evaluate(spec.model, spec.training, profile, "megatron", c)
    assert float(ev40.dp_comm_total[0]) > float(ev.dp_comm_total[0])


def test_candidates_carry_cp_through_the_solver():
    spec, _ = load_spec(EXAMPLES / "llama3-70b-128k.yaml")
    profile = load_profile("dgx16").profile
    res = search(spec.model, spec.training, profile, "megatron")
    best = res.best.layout
    again = candidates_of(spec.model, [best])
    assert int(again.cp[0]) == best.cp and best.world_size == profile.world_size
    assert dataclasses.asdict(best)["cp"] == best.cp


def test_odd_sequence_still_plans_without_context_parallelism(tmp_path, runner):
    text = (EXAMPLES / "llama3-8b.yaml").read_text().replace("seq_length: 8192", "seq_length: 8191")
    (tmp_path / "s.yaml").write_text(text)
    r = plan(runner, tmp_path / "s.yaml", "--cluster", "dgx16", "--runtime", "megatron", "--no-write")
    assert r.exit_code == 0, r.output
    model, training = _spec_of(tmp_path / "s.yaml")
    c, _ = enumerate_layouts(model, training, load_profile("dgx16").profile, "megatron")
    assert set(np.unique(c.cp)) == {1}
    assert not c.sequence_parallel.any()  # 8191 tokens do not split over any tp > 1


def test_sequence_parallelism_needs_the_tokens_to_split(tmp_path, runner):
    text = (EXAMPLES / "llama3-8b.yaml").read_text().replace("seq_length: 8192", "seq_length: 8190")
    (tmp_path / "s.yaml").write_text(text)
    r = plan(runner, tmp_path / "s.yaml", "--cluster", "dgx16", "--tp", "4", "--sp", "--no-write")
    assert r.exit_code == 2 and "does not divide them; use --no-sp" in r.output, r.output
    model, training = _spec_of(tmp_path / "s.yaml")
    c, _ = enumerate_layouts(model, training, load_profile("dgx16").profile, "deepspeed", Pins(tp=2))
    assert c.sequence_parallel.any()  # 8190 = 2 x 4095


def test_scalar_candidates_evaluate_like_one_element_arrays():
    spec, _ = load_spec(EXAMPLES / "llama3-8b.yaml")
    profile = load_profile("dgx16").profile
    c, _ = enumerate_layouts(spec.model, spec.training, profile, "deepspeed")
    one = evaluate(spec.model, spec.training, profile, "deepspeed", c.take([5]))
    scalar = evaluate(spec.model, spec.training, profile, "deepspeed", c.take(5))
    assert np.shape(scalar.time.step) == () and float(scalar.time.step) == float(one.time.step[0])
