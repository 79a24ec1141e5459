"""The time model against published runs (the issue's targets), the calibration data and its
resolution rule, DeepSpeed's own memory estimators, and `calibrate` closing the loop on runs."""

from __future__ import annotations

import json

import pytest
import yaml

from orchestrator.calibrate import (
    BOUNDS,
    calibrate,
    calibrated_profile_yaml,
    error_summary,
    published_rows,
    step_time_from_tflops,
)
from orchestrator.costmodel import evaluate
from orchestrator.costmodel.calibration import FIELDS, calibration_table, resolve_efficiency
from orchestrator.plan.layout import Pins
from orchestrator.plan.solver import enumerate_layouts, search
from orchestrator.spec.cluster import ClusterProfile, load_profile
from orchestrator.spec.model import load_spec

from ..conftest import EXAMPLES


@pytest.fixture(scope="module")
def errors():
    from orchestrator.calibrate import row_errors
    from orchestrator.calibrate.published import all_published_rows

    return row_errors(all_published_rows())


# ---- the issues' accuracy targets on the calibration sets: mean <= 5 %, max <= 10 % per entry on
# the dense sets (issue 11); mean <= 10 % over published_runs_moe.yaml (issue 24), whose max stays
# within the reserved evaluation's 30 %
def test_step_time_error_on_published_runs(errors):
    """Every engine on every hardware, on its own published runs."""
    from orchestrator.calibrate.published import moe_rows

    moe_file = {r.id for r in moe_rows()}
    # Megatron-LM, FSDP, DeepSpeed (ZeRO-3 once, its pipeline engine twice), MoE file
    assert len(errors) == 19 + 13 + 1 + 2 + len(moe_file)
    assert len(moe_file) == 13
    dense_sets = [e for e in errors if e.id not in moe_file]
    s = error_summary(dense_sets)
    assert s["mean"] <= 0.05 and s["max"] <= 0.10, s
    entries = {e.hardware for e in errors}
    assert entries == {"megatron/a100-sxm4-hdr", "megatron/h100-sxm5-ndr", "deepspeed-zero3/a100-sxm4-hdr",
                       "deepspeed-zero3/h100-sxm5-ndr", "megatron/gb200-nvl72", "megatron/gb300-nvl72",
                       "deepspeed-pipeline/a100-sxm4-hdr"}
    for hw in entries:
        sub = error_summary([e for e in dense_sets if e.hardware == hw])
        assert sub["mean"] <= 0.05 and sub["max"] <= 0.10, (hw, sub)
    # A run an entry scores but declines to fit says why in calibration.yaml (scored_not_fitted); the
    # bound holds for the runs the model claims to describe.
    unfitted = {rid for e in calibration_table()["entries"] for rid in (e.get("scored_not_fitted") or {})}
    assert unfitted <= moe_file and len(unfitted) <= 1, unfitted
    moe = error_summary([e for e in errors if e.id in moe_file - unfitted])
    assert moe["mean"] <= 0.10 and moe["max"] <= 0.30, moe


def test_calibration_file_is_current(errors):
    """calibration.yaml states the error of the model it was fitted with; a model change must refit
    (python scripts/fit_calibration.py)."""
    for entry in calibration_table()["entries"]:
        scored = entry.get("scored_not_fitted") or {}
        sub = error_summary([e for e in errors if e.hardware == entry["id"] and e.id not in scored])
        # A run scored but not fitted is recorded with its error apart from the entry's figures.
        for e in (e for e in errors if e.id in scored):
            assert scored[e.id]["error"] == pytest.approx(e.rel_error, abs=2e-3), e.id
        assert sub["rows"] == entry["step_time_error"]["rows"]
        assert sub["mean"] == pytest.approx(entry["step_time_error"]["mean"], abs=2e-3), entry["id"]
        assert sub["max"] == pytest.approx(entry["step_time_error"]["max"], abs=2e-3), entry["id"]
        # The interval: errors on runs held out of the fit, never below the in-sample mean.
        assert entry["step_time_error"]["held_out_mean"] >= entry["step_time_error"]["mean"] - 1e-4


def test_fitted_values_are_physical():
    table = calibration_table()
    for entry in [table["default"], *table["entries"]]:
        for f in FIELDS:
            v = entry["efficiency"][f]
            if f in ("zero3_stall_us", "moe_layer_us"):  # times, not fractions
                assert 0 <= v <= BOUNDS[f][1], (entry.get("id"), f, v)
                continue
            assert 0 <= v <= 1, (entry.get("id"), f, v)
            if f not in ("dp_overlap", "tp_overlap", "ep_overlap"):
                assert v > 0
    for name in ("dgx16", "dgx-a100-80gb-hdr", "hgx-h200-ndr", "local", "gb200-nvl72", "gb300-nvl72", "dgx-b200"):
        p = load_profile(name).profile
        assert p.intra_node.latency_us >= 0 and p.inter_node.latency_us >= 0


# formulas.md Sec. 3c [derived]: Eq. 3 applied to SC21 Table 1 gives these iteration times.
SC21_STEP = {"1.7B": 3.5, "3.6B": 3.7, "7.5B": 3.7, "18.4B": 9.4, "39.1B": 14.5, "76.1B": 16.1, "145.6B": 24.8,
             "310.1B": 37.6, "529.6B": 54.1, "1008B": 102.6}


def test_published_tflops_back_to_step_time():
    rows = {r.id: r for r in published_rows()}
    for size, step in SC21_STEP.items():
        r = rows[f"megatron_sc21_t1_{size}"]
        assert r.measured_step_s == pytest.approx(step, abs=0.06), size
    # Eq. 2 reproduces the published parameter counts (rounded as published).
    published = {"1.7B": 1.7, "3.6B": 3.6, "7.5B": 7.5, "18.4B": 18.4, "39.1B": 39.1, "76.1B": 76.1,
                 "145.6B": 145.6, "310.1B": 310.1, "529.6B": 529.6, "1008B": 1008.0}
    for size, params_b in published.items():
        assert round(rows[f"megatron_sc21_t1_{size}"].model.num_params / 1e9, 1) == params_b
    # The Megatron-Core formula: 462B row, 3072 sequences of 4096 at 459.9 TFLOP/s on 6144 GPUs.
    t = step_time_from_tflops("F = 72 ...", 3072, 4096, 112, 18432, 131072, 6144, 459.9)
    assert t == pytest.approx(rows["megatron_core_h100_weak_scaling_462B"].measured_step_s)


def test_not_a_lookup_table():
    """Outside the set the model behaves like physics: twice the batch is about twice the step,
    twice the GPUs for the same work is faster, and a smaller GEMM runs below peak."""
    row = next(r for r in published_rows() if r.id == "megatron_sc21_t1_39.1B")
    c, _ = enumerate_layouts(row.model, row.training, row.profile, row.runtime, row.pins)
    base = float(evaluate(row.model, row.training, row.profile, row.runtime, c, engine=row.engine).time.step[0])
    big = row.training.model_copy(update={"global_batch_size": 2 * row.training.global_batch_size})
    c2, _ = enumerate_layouts(row.model, big, row.profile, row.runtime, row.pins)
    double = float(evaluate(row.model, big, row.profile, row.runtime, c2, engine=row.engine).time.step[0])
    assert 1.8 < double / base < 2.05
    # Shipped examples plan at MFUs real runs report (between 15 % and 75 %).
    for name, prof, nodes in [("llama3-8b", "dgx16", 1), ("llama3-70b", "dgx16", 16), ("llama3-405b", "dgx16", 2048),
                              ("gpt3-175b", "dgx-a100-80gb-hdr", 48)]:
        spec, _ = load_spec(EXAMPLES / f"{name}.yaml")
        best = search(spec.model, spec.training, load_profile(prof).profile.resized(nodes=nodes), "megatron").best
        assert 0.15 < best.mfu < 0.75, (name, best.mfu)


# ---- resolution: per engine; profile values win, `extends` inherits, H200 shares Hopper's entry,
# an engine without data borrows and says so, unknown GPU -> default
def test_efficiency_resolution(tmp_path):
    dgx = load_profile("dgx16").profile
    r = resolve_efficiency(dgx)
    assert r.entry == "megatron/h100-sxm5-ndr" and all(src.startswith("calibration:") for _, src in r.sources)
    assert r.domain == "fitted" and r.interval == r.held_out_max and r.rows == 12  # 9 dense, 3 MoE
    assert "n=12" in r.describe() and "megatron/h100-sxm5-ndr" in r.describe()
    assert resolve_efficiency(load_profile("hgx-h200-ndr").profile).entry == "megatron/h100-sxm5-ndr"
    assert resolve_efficiency(load_profile("dgx-a100-80gb-hdr").profile).entry == "megatron/a100-sxm4-hdr"
    z3 = resolve_efficiency(dgx, "deepspeed-zero3")
    assert z3.entry == "deepspeed-zero3/h100-sxm5-ndr" and z3.domain == "fitted" and z3.rows == 5
    assert z3.gemm != r.gemm  # fitted on its own runs, not Megatron's
    ds = resolve_efficiency(dgx, "deepspeed")
    assert ds.domain == "borrowed" and ds.entry == "deepspeed-zero3/h100-sxm5-ndr" and ds.interval is None
    assert "outside the fitted domain" in ds.describe()
    local = resolve_efficiency(load_profile("local").profile)
    assert dict(local.sources)["gemm"] == "profile" and local.gemm == load_profile("local").profile.efficiency.gemm
    (tmp_path / "mine.yaml").write_text("extends: dgx16\nnodes: 2\nefficiency: {gemm: 0.55}\n")
    (tmp_path / "theirs.yaml").write_text("extends: mine\n")
    mine = resolve_efficiency(load_profile("theirs", tmp_path).profile)
    assert mine.gemm == 0.55 and mine.hbm == r.hbm and dict(mine.sources)["hbm"] == "calibration:megatron/h100-sxm5-ndr"
    odd = dgx.model_copy(update={"gpu": dgx.gpu.model_copy(update={"name": "MI300X"})})
    assert resolve_efficiency(odd).entry is None and resolve_efficiency(odd).domain == "default"
    assert resolve_efficiency(odd).interval is None
    assert resolve_efficiency(odd).gemm == calibration_table()["default"]["efficiency"]["gemm"]


def test_deepspeed_runtime_uses_each_layouts_engine():
    """One search mixes ZeRO-3 layouts (the deepspeed-zero3 entry) and ZeRO-1 layouts (borrowed):
    each is evaluated with its own engine's efficiencies."""
    from orchestrator.costmodel.calibration import Resolved

    spec, _ = load_spec(EXAMPLES / "llama3-8b.yaml")
    profile = load_profile("dgx16").profile.resized(nodes=2)
    pins = Pins(tp=1, pp=1, micro_batch_size=1, recompute="full", sequence_parallel=False)
    c, _ = enumerate_layouts(spec.model, spec.training, profile, "deepspeed", pins)
    mixed = evaluate(spec.model, spec.training, profile, "deepspeed", c)
    for i, z in enumerate(c.zero_stage.tolist()):
        eng = "deepspeed-zero3" if z == 3 else "deepspeed"
        one = evaluate(spec.model, spec.training, profile, "deepspeed", c.take([i]),
                       efficiency=resolve_efficiency(profile, eng))
        assert float(one.time.step[0]) == pytest.approx(float(mixed.time.step[i]), rel=1e-12)
    assert isinstance(resolve_efficiency(profile, "deepspeed"), Resolved)


# ---- DeepSpeed's own model-state estimators on the same inputs
@pytest.mark.parametrize("nodes", [1, 4])
def test_deepspeed_zero2_estimator_agrees(nodes):
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    spec, _ = load_spec(EXAMPLES / "llama3-8b.yaml")
    profile = load_profile("dgx16").profile.resized(nodes=nodes)
    pins = Pins(tp=1, pp=1, zero_stage=2, micro_batch_size=1, recompute="full", sequence_parallel=False)
    c, _ = enumerate_layouts(spec.model, spec.training, profile, "deepspeed", pins)
    ev = evaluate(spec.model, spec.training, profile, "deepspeed", c)
    psi = spec.model.num_params
    _, gpu = estimate_zero2_model_states_mem_needs(psi, num_gpus_per_node=8, num_nodes=nodes, cpu_offload=False)
    ours = float(ev.memory.params[0] + ev.memory.grads[0] + ev.memory.optimizer[0])
    # DeepSpeed's estimator (2 + 18/N bytes per parameter) counts a 16-bit gradient partition beside
    # the fp32 one (2/N); with fp32 accumulation (dsorch's ds_config) stage 2 accumulates straight
    # into the fp32 partition (measured: no lasting 16-bit gradient), dsorch's 2 + (4 + 12)/N.
    assert ours == pytest.approx(gpu - 2 * psi / profile.world_size, rel=1e-9)


def test_deepspeed_zero3_estimator_agrees_term_by_term():
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    spec, _ = load_spec(EXAMPLES / "llama3-8b.yaml")
    profile = load_profile("dgx16").profile.resized(nodes=2)
    pins = Pins(tp=1, pp=1, zero_stage=3, micro_batch_size=1, recompute="full", sequence_parallel=False)
    c, _ = enumerate_layouts(spec.model, spec.training, profile, "deepspeed", pins)
    ev = evaluate(spec.model, spec.training, profile, "deepspeed", c)
    psi, n = spec.model.num_params, profile.world_size
    layer = spec.model.params_per_layer
    _, gpu, largest = estimate_zero3_model_states_mem_needs(psi, layer, num_gpus_per_node=8, num_nodes=2,
                                                            cpu_offload=False, cpu_offload_params=False)
    # DeepSpeed's 18 bytes/param/N are dsorch's 2 + 4 + 12 with fp32 accumulation (the fp32 gradient
    # partition in stage3.py's grad_partitions_flat_buffer is what the optimizer steps on); its
    # 4 x largest layer is dsorch's two gathered 16-bit layers (the one in use and the prefetched one).
    # The estimator leaves out the reduce bucket stage3.py allocates whole at start with
    # contiguous_gradients (reduce_bucket_size 16-bit elements), which dsorch counts.
    from orchestrator.costmodel.evaluate import ZERO_BUCKET_ELEMENTS

    states = float(ev.memory.params[0] + ev.memory.grads[0] + ev.memory.optimizer[0])
    assert states == pytest.approx(gpu - largest, rel=1e-9)
    assert n > 1
    assert float(ev.memory.comm_buffers[0]) == pytest.approx(largest + 2 * ZERO_BUCKET_ELEMENTS, rel=1e-12)


# ---- calibrate: recover known efficiencies from runs the model itself generated
TRUE = {"gemm": 0.6, "attention": 0.45, "hbm": 0.7, "intra_node_comm": 0.65, "inter_node_comm": 0.55,
        "dp_overlap": 0.5, "tp_overlap": 0.0, "zero3_stall_us": 300.0, "grouped_gemm": 0.5, "ep_overlap": 0.0,
        "moe_layer_us": 0.0, "fp8_gemm": 1.0}


def _synthetic_records(tmp_path):
    from orchestrator.calibrate import Row, row_errors
    from orchestrator.costmodel.calibration import Resolved

    spec, _ = load_spec(EXAMPLES / "llama3-8b.yaml")
    truth = Resolved(**TRUE, sources=(), entry=None, mean_rel_error=None, max_rel_error=None)
    base = load_profile("dgx16").profile
    layouts = [dict(tp=1, pp=1, dp=16, zero_stage=1, micro_batch_size=1, recompute="none", sequence_parallel=False),
               dict(tp=2, pp=1, dp=8, zero_stage=1, micro_batch_size=2, recompute="selective", sequence_parallel=True),
               dict(tp=4, pp=2, dp=2, zero_stage=1, micro_batch_size=1, recompute="full", sequence_parallel=True),
               dict(tp=8, pp=1, dp=2, zero_stage=1, micro_batch_size=4, recompute="none", sequence_parallel=True),
               dict(tp=2, pp=4, dp=2, zero_stage=1, micro_batch_size=1, recompute="none", sequence_parallel=False)]
    records, rows = [], []
    for L in layouts:
        nodes = L["tp"] * L["pp"] * L["dp"] // 8
        rows.append(Row(str(L), spec.model, spec.training, base.resized(nodes=nodes), "deepspeed",
                        Pins(vpp=1, **L), 1.0))
    measured = row_errors(rows, lambda row: truth)
    for L, m in zip(layouts, measured):
        records.append({"model": str(EXAMPLES / "llama3-8b.yaml"), "layout": {**L, "vpp": 1},
                        "step_time_s": m.predicted_s, "runtime": "deepspeed"})
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump({"records": records}))
    return path, measured


def test_calibrate_recovers_known_efficiencies(tmp_path):
    path, measured = _synthetic_records(tmp_path)
    profile = load_profile("dgx16").profile
    calibrated, report = calibrate([path], profile, prior_weight=0.0)
    d = report.as_dict()
    assert d["step_time_error_before"]["max"] > 0.1  # the shipped values do not describe this "cluster"
    assert d["step_time_error_after"]["max"] < 0.02
    # gemm and hbm trade against each other on few runs (both are at work in every GEMM), so the
    # test is what a user needs: a layout the fit never saw is predicted as the truth would.
    from orchestrator.calibrate import Row, row_errors
    from orchestrator.costmodel.calibration import Resolved

    spec, _ = load_spec(EXAMPLES / "llama3-8b.yaml")
    held_out = Row("held out", spec.model, spec.training, profile.resized(nodes=2), "deepspeed",
                   Pins(tp=4, pp=1, dp=4, vpp=1, zero_stage=1, micro_batch_size=2, recompute="selective",
                        sequence_parallel=True), 1.0)
    truth = Resolved(**TRUE, sources=(), entry=None, mean_rel_error=None, max_rel_error=None)
    true_s = row_errors([held_out], lambda row: truth)[0].predicted_s
    fitted = resolve_efficiency(calibrated, "deepspeed")
    assert all(src == "profile" for _, src in fitted.sources)
    assert row_errors([held_out], lambda row: fitted)[0].predicted_s == pytest.approx(true_s, rel=0.03)
    text = calibrated_profile_yaml(calibrated, report, name="mine")
    (tmp_path / "mine.yaml").write_text(text)
    again = load_profile("mine", tmp_path).profile
    assert again.gpu.name == profile.gpu.name and again.efficiency.gemm == calibrated.efficiency.gemm
    assert text == calibrated_profile_yaml(calibrated, report, name="mine")  # deterministic


def test_calibrate_from_a_run_directory(tmp_path, runner, monkeypatch):
    from orchestrator.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(EXAMPLES)
    r = runner.invoke(main, ["plan", "examples/tiny.yaml", "--cluster", "local", "--out", "p"])
    assert r.exit_code == 0, r.output
    run = tmp_path / "p" / "run"
    run.mkdir()
    lines = [{"step": i, "loss": 1.0, "step_time_s": 0.5 if i else 3.0, "peak_mem_gib": 0.4,
              "mem_kind": "cpu_peak_rss"} for i in range(10)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    local = load_profile("local").profile
    calibrated, report = calibrate([run], local)
    rec = report.as_dict()["records"][0]
    assert rec["measured_step_s"] == 0.5  # warm-up step dropped, median of the rest
    assert abs(rec["predicted_after_s"] / 0.5 - 1) < abs(rec["predicted_before_s"] / 0.5 - 1) + 1e-9
    assert isinstance(calibrated, ClusterProfile)
    assert all(0 <= getattr(calibrated.efficiency, f) <= 1 for f in FIELDS if f not in ("zero3_stall_us", "moe_layer_us"))
    assert calibrated.efficiency.zero3_stall_us >= 0


def test_calibrate_finds_a_submitted_runs_plan_in_the_registry_and_names_the_profile_after_its_file(
    tmp_path, runner, monkeypatch
):
    """`dsorch submit` puts runs in runs/PLAN-KEY, outside the plan directory: the registry knows
    the plan, so calibrate needs no --plan; the profile written to local-mine.yaml is local-mine."""
    from orchestrator.cli.main import main
    from orchestrator.run.registry import Registry

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DSORCH_PROFILES_DIR", raising=False)
    (tmp_path / "examples").symlink_to(EXAMPLES)
    assert runner.invoke(main, ["plan", "examples/tiny.yaml", "--cluster", "local", "--out", "p"]).exit_code == 0
    run = tmp_path / "runs" / "p-1"
    run.mkdir(parents=True)
    lines = [{"step": i, "loss": 1.0, "step_time_s": 0.5, "peak_mem_gib": 0.4, "mem_kind": "cpu_peak_rss"}
             for i in range(10)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    with Registry(tmp_path).reserve("p", force=False) as (insert, _update):
        insert(job_id="77", executor="local", cluster="local", plan_dir="p", plan_sha256="0", state="COMPLETED",
               submitted_at="2026-01-01T00:00:00+00:00", run_dir=str(run), log_dir=str(tmp_path), requeues=0)
    r = runner.invoke(main, ["calibrate", "runs/p-1", "--cluster", "local", "--out", "local-mine.yaml"])
    assert r.exit_code == 0, r.output
    assert yaml.safe_load((tmp_path / "local-mine.yaml").read_text())["name"] == "local-mine"
    r = runner.invoke(main, ["calibrate", "runs/p-1", "--cluster", "local", "--name", "x", "--out", "y.yaml"])
    assert r.exit_code == 2 and "a profile is found by its file's name (y)" in r.output, r.output
    assert not (tmp_path / "y.yaml").exists()
    (run.parent / "elsewhere").mkdir()
    (run.parent / "elsewhere" / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text())
    r = runner.invoke(main, ["calibrate", "runs/elsewhere", "--cluster", "local"])
    assert r.exit_code == 2 and "pass the plan directory it was trained from (--plan DIR)" in r.output, r.output

# ---- memory against the published peaks (issue 11): what ran must be predicted to fit
def test_published_fsdp_peaks():
    """torchtitan's two Llama 3.1 8B FSDP peaks (max reserved, 96 GB H100s): the same activations
    at 8 and 128 ranks, so the ZeRO-3 state sharding and the PyTorch loss working set are both
    checked. Within 5 %."""
    from orchestrator.calibrate.published import fsdp_rows
    from orchestrator.calibrate.rows import predicted_peak_gib

    rows = [r for r in fsdp_rows() if r.measured_peak_gib is not None]
    assert len(rows) == 2
    for row in rows:
        predicted = predicted_peak_gib(row)
        assert predicted == pytest.approx(row.measured_peak_gib, rel=0.05), row.id
        assert predicted <= row.profile.gpu.memory_gib  # it ran


def test_known_to_run_megatron_layout_fits():
    """Nemotron-4 340B at the layout issue 11 lists as known to run (TP8 PP8 vpp12, selective
    recomputation, 80 GB H100s; 6144 GPUs, sequence 4096, batch 2304 as in its technical report)
    fits. Its squared-ReLU MLP has GeLU's two matrices and the same saved tensors."""
    from orchestrator.spec.model import ModelSpec, TrainingSpec

    model = ModelSpec(num_layers=96, hidden_size=18432, ffn_hidden_size=73728, num_attention_heads=96, num_kv_heads=8,
                      vocab_size=256000, activation="gelu", tied_embeddings=False, bias=False)
    training = TrainingSpec(seq_length=4096, global_batch_size=2304, precision="bf16", train_tokens=9e12)
    profile = load_profile("dgx16").profile.resized(nodes=768)
    pins = Pins(tp=8, pp=8, vpp=12, micro_batch_size=1, recompute="selective", sequence_parallel=True, zero_stage=1)
    res = search(model, training, profile, "megatron", pins)
    assert res.best is not None and res.best.fits, [s.memory_gib for s in res.closest]


def test_deepspeed_runs_found_are_sourced_and_used_or_explained():
    """published_runs_deepspeed.yaml: every run names its source; what the fit leaves out says why,
    and nothing MT-NLG-shaped (reserved for evaluation) is fitted."""
    from importlib import resources

    from orchestrator.calibrate.published import all_published_rows

    doc = yaml.safe_load(resources.files("orchestrator.costmodel").joinpath("published_runs_deepspeed.yaml")
                         .read_text(encoding="utf-8"))
    for run in doc["runs"]:
        assert run["source"]["ref"] and run["use"] in ("fit", "none"), run["id"]
        if run["use"] == "none":
            assert len(run["reason"]) > 20, run["id"]
        else:
            # MT-NLG 530B, BLOOM-176B and GPT-NeoX-20B shapes: reserved for evaluation.
            shape = (run["model"]["num_layers"], run["model"]["hidden_size"])
            assert shape not in ((105, 20480), (70, 14336), (44, 6144)), run["id"]
    ids = {r["id"] for r in doc["runs"]}
    used = [r for r in all_published_rows() if r.id in ids]
    assert [r.id for r in used] == [r["id"] for r in doc["runs"] if r["use"] == "fit"]


def test_outside_the_fitted_domain_has_no_interval(tmp_path):
    """Only an entry fitted on runs of this engine, GPU and fabric, with the profile's own values left
    alone, gives an interval; everything else says why it gives none."""
    dgx = load_profile("dgx16").profile
    assert resolve_efficiency(dgx).domain == "fitted"
    roce = dgx.model_copy(update={"inter_node": dgx.inter_node.model_copy(update={"kind": "roce"})})
    r = resolve_efficiency(roce)
    assert r.domain == "borrowed" and r.interval is None and "fitted on infiniband, not roce" in r.describe()
    h200 = resolve_efficiency(load_profile("hgx-h200-ndr").profile)
    assert h200.interval is None and "no runs on H200-SXM-141GB" in h200.describe()
    (tmp_path / "mine.yaml").write_text("extends: dgx16\nefficiency: {gemm: 0.45}\n")
    mine = resolve_efficiency(load_profile("mine", tmp_path).profile)
    assert mine.domain == "adjusted" and mine.interval is None and "the profile states gemm" in mine.describe()
    # What the layout uses beyond the entry's runs: TP overlap was in the H100 runs, not in SC21's.
    a100 = resolve_efficiency(load_profile("dgx-a100-80gb-hdr").profile)
    assert a100.beyond(8, 4, 1, False, dp_overlap=True) == "overlapped DP reduction (none of its runs)"
    assert r.beyond(8, 4, 1, False) is None  # outside already: described by the domain


def test_model_features_no_fitted_run_had_put_a_plan_outside_the_domain():
    """GPT-OSS's attention sinks, sliding windows and quick-GEGLU are in no fitted run; its one published
    run (GB300) is scored apart. A GPT-OSS plan on GB300 is outside the fitted domain and quotes that
    run's error; a dense Llama plan there keeps the entry's interval, which that run no longer widens."""
    from orchestrator.costmodel.calibration import model_features

    gb300 = load_profile("gb300-nvl72").profile
    oss, _ = load_spec(EXAMPLES / "gpt-oss-120b.yaml")
    assert model_features(oss.model, oss.training.seq_length) == ("attention_sinks", "sliding_window", "quick_geglu")
    # A window as long as the sequence changes nothing.
    wide = oss.model.model_copy(update={"sliding_window": oss.training.seq_length, "attention_sinks": False})
    assert model_features(wide, oss.training.seq_length) == ("quick_geglu",)
    r = resolve_efficiency(gb300)
    entry = next(e for e in calibration_table()["entries"] if e["id"] == r.entry)
    scored = entry["scored_not_fitted"]
    assert r.domain == "fitted" and len(scored) == 1
    (rid, run), = scored.items()
    assert abs(run["error"]) > 0.2 and set(run["features"]) == {"attention_sinks", "sliding_window", "quick_geglu"}
    assert r.interval == entry["step_time_error"]["held_out_max"] < abs(run["error"])
    text = r.beyond(1, 1, 1, False, ep=8, moe=True, features=("attention_sinks",))
    assert text.startswith("attention sinks") and rid in text and f"{100 * run['error']:+.0f} %" in text
    assert r.beyond(1, 1, 1, False, ep=8, moe=True) is None
    res = search(oss.model, oss.training, gb300.resized(nodes=16), "megatron", Pins())
    assert res.best.interval is None
    assert "outside the fitted domain of megatron/gb300-nvl72" in res.best.basis and rid in res.best.basis
    llama, _ = load_spec(EXAMPLES / "llama3-8b.yaml")
    best = search(llama.model, llama.training, gb300.resized(nodes=2), "megatron").best
    assert best.interval == r.interval, best.basis


def test_calibrate_refuses_an_fp8_record_on_a_gpu_without_fp8(tmp_path):
    from orchestrator.errors import SpecError

    rec = {"model": str(EXAMPLES / "llama3-70b-fp8.yaml"), "runtime": "megatron", "step_time_s": 30.0,
           "layout": {"tp": 8, "pp": 4, "dp": 4, "micro_batch_size": 1, "zero_stage": 1, "sequence_parallel": True}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({"records": [rec]}))
    with pytest.raises(SpecError, match="states no FP8 peak"):
        calibrate([tmp_path / "r.yaml"], load_profile("dgx-a100-80gb-hdr").profile)


def test_memory_near_capacity_is_flagged_with_the_models_error():
    """A layout within the largest under-prediction seen on published peaks of the capacity gets a
    note; one with room does not."""
    import dataclasses

    from orchestrator.costmodel.calibration import memory_error
    from orchestrator.cli.plan_table import memory_tight

    err = memory_error()
    assert err["rows"] == 2 and 0 < err["largest_under"] < 0.05
    spec, _ = load_spec(EXAMPLES / "llama3-8b.yaml")
    best = search(spec.model, spec.training, load_profile("dgx16").profile, "deepspeed").best
    total = best.memory_gib["total"]
    close = dataclasses.replace(best, capacity_gib=total * (1 + err["largest_under"] / 2))
    assert "within the memory model's error" in memory_tight(close)
    assert memory_tight(dataclasses.replace(best, capacity_gib=total * 1.2)) is None


# ---- NVL72 and B200 profiles; published_runs_moe.yaml (issue 24)
@pytest.mark.parametrize("name, gpus_per_node, domain, hardware", [
    ("gb200-nvl72", 4, 72, "megatron/gb200-nvl72"),
    ("gb300-nvl72", 4, 72, "megatron/gb300-nvl72"),
    ("dgx-b200", 8, 8, "megatron/gb200-nvl72"),
])
def test_blackwell_profiles_load_with_their_nvlink_domain(name, gpus_per_node, domain, hardware):
    """An NVL72 rack is one 72-GPU NVLink domain of 4-GPU trays, of which the shipped profile takes
    16 (64 GPUs); the domain is at most the world (two trays: 8 GPUs). A DGX B200's domain is its
    node. DeepEP is software, off unless the site says so. The B200 shares the GB200 entry's
    efficiencies but has no runs of its own: no interval."""
    p = load_profile(name).profile
    assert p.gpus_per_node == gpus_per_node and p.intra_node.domain_gpus in (None, domain)
    assert p.nvlink_domain == min(domain, p.world_size) == {"dgx-b200": 8}.get(name, 64)
    assert p.resized(nodes=2).nvlink_domain == min(domain, 2 * gpus_per_node)
    assert p.resized(nodes=18).nvlink_domain == p.resized(nodes=64).nvlink_domain == domain
    assert p.features.deepep is False and p.gpu.peak_tflops.fp8 == 2 * p.gpu.peak_tflops.bf16
    r = resolve_efficiency(p)
    assert r.entry == hardware
    assert (r.domain == "fitted") == (name != "dgx-b200"), r.describe()


def _moe_doc() -> dict:
    from importlib import resources

    return yaml.safe_load(resources.files("orchestrator.costmodel").joinpath("published_runs_moe.yaml")
                          .read_text(encoding="utf-8"))


def test_published_moe_file_is_the_reference_copy():
    """costmodel/published_runs_moe.yaml ships the calibration file as it is (where the checkout has
    the shared reference beside it)."""
    from importlib import resources
    from pathlib import Path

    ref = Path(__file__).resolve().parents[3] / "shared" / "reference" / "calibration_runs_moe.yaml"
    if not ref.exists():
        pytest.skip("no ../shared/reference beside this checkout")
    ours = resources.files("orchestrator.costmodel").joinpath("published_runs_moe.yaml").read_text(encoding="utf-8")
    assert ours == ref.read_text(encoding="utf-8")


def test_moe_runs_as_rows():
    """Every run of published_runs_moe.yaml with a step time is a megatron row on its GPU's entry,
    except the Megatron-FSDP ZeRO-3 run, which says why; the models match their published sizes
    and the layouts are the published ones."""
    from orchestrator.calibrate.published import moe_runs

    rows, skipped = moe_runs()
    doc = _moe_doc()
    assert len(rows) + len(skipped) == doc["n_runs"] == len(doc["runs"]) == 15
    assert {s.id: s.reason.split(":")[0].split(" ")[0] for s in skipped} == {
        "mlm-moe-mixtral-8x22b-h100-128g-tp4pp8vp7ep2-layout-only": "layout",
        "mb2511-gb300-llama3-70b-fp8cs-64g-tp1pp1-fsdp-mbs2": "Megatron-FSDP"}
    by_id = {r.id: r for r in rows}
    runs = {r["id"]: r for r in doc["runs"]}
    for rid, row in by_id.items():
        run = runs[rid]
        assert row.runtime == "megatron" and row.measured_step_s == run["measured"]["step_time_s"]
        assert row.profile.world_size == run["hardware"]["num_gpus"]
        assert row.hardware == {"H100-SXM5-80GB": "megatron/h100-sxm5-ndr", "GB200 (NVL72)": "megatron/gb200-nvl72",
                                "GB300 (NVL72)": "megatron/gb300-nvl72"}[run["hardware"]["gpu"]]
        L = run["layout"]
        assert (row.pins.tp, row.pins.pp, row.pins.cp, row.pins.dp, row.pins.ep) == (
            L["tp"], L["pp"], L["cp"], L["dp"], L["ep"] or 1)
        assert row.pins.vpp == (L["vp"] or 1) and row.pins.recompute == "none" and row.pins.zero_stage == 1
        assert row.pins.micro_batch_size == run["training"]["micro_batch_size"]
        # Megatron-Bridge's performance configs reduce gradients in bf16; Megatron-LM's README runs in fp32.
        assert row.training.grad_reduce_in_fp32 == (run["source"]["repo"] != "NVIDIA-NeMo/Megatron-Bridge")
        assert (row.model.moe is None) == (run["model"]["type"] == "dense")
        # Published sizes: total and active parameters within 3 % (DeepSeek-V3 671B / 37B, Qwen3
        # 30.5B / 3.3B and 235B / 22B, Mixtral 46.7B / 12.9B), dense Llama 8B / 405B.
    published = {"deepseek_v3": (671, 37), "qwen3_30b_a3b": (30.5, 3.3), "qwen3_235b_a22b": (235, 22),
                 "mixtral_8x7b": (46.7, 12.9), "llama3_8b": (8.03, 8.03), "llama31_405b": (405, 405)}
    for rid, row in by_id.items():
        key = runs[rid]["model"]["key"]
        if key in published:
            total, active = published[key]
            assert row.model.num_params / 1e9 == pytest.approx(total, rel=0.03), rid
            assert row.model.active_params / 1e9 == pytest.approx(active, rel=0.03), rid


def test_moe_models_from_the_published_strings():
    """What the file states in words: DeepSeek-V3's MLA and router (trained without MTP), GPT-OSS's
    window, sinks, biases and clamped gate, Qwen3's head width and QK-norm; FP8 recipes; the
    dispatcher the recipes used; Megatron's default expert-TP (tp)."""
    from orchestrator.calibrate.published import moe_layout_rows, moe_runs

    rows = {r.id: r for r in moe_runs()[0]}
    ds = rows["mb2511-gb200-dsv3-fp8mx-256g-tp1pp8vp4ep32-mbs1"]
    assert ds.model.mla.model_dump() == {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                                         "qk_rope_head_dim": 64, "v_head_dim": 128}
    moe = ds.model.moe
    assert (moe.num_experts, moe.top_k, moe.ffn_hidden_size, moe.shared_experts, moe.shared_ffn) == (256, 8, 2048, 1, 2048)
    assert (moe.dense_leading_layers, moe.router, moe.groups, moe.group_top_k, moe.scale) == (3, "sigmoid", 8, 4, 2.5)
    assert moe.expert_bias and moe.load_balancing == "seq_aux_loss" and ds.model.mtp_layers == 0
    assert ds.training.fp8 == "e4m3" and ds.fp8_recipe == "mxfp8" and ds.training.moe_dispatcher == "flex"
    assert ds.profile.features.deepep and ds.profile.gpu.name == "GB200" and ds.profile.nodes == 64
    assert ds.engine is not None and not ds.engine.param_gather_overlap  # MXFP8 NaN workaround in the recipe
    assert rows["mb2511-gb300-dsv3-bf16-256g-tp1pp2vp4ep32-mbs1"].engine.param_gather_overlap
    oss = rows["mb2511-gb300-gptoss-120b-bf16-64g-tp1pp1ep64-mbs2"].model
    assert (oss.sliding_window, oss.global_attention_every, oss.attention_sinks, oss.bias) == (128, 2, True, True)
    assert (oss.activation, oss.activation_clamp, oss.glu_linear_offset, oss.kv_channels) == ("quick_geglu", 7.0, 1.0, 64)
    assert rows["mb2511-gb300-gptoss-120b-bf16-64g-tp1pp1ep64-mbs2"].training.moe_dispatcher == "alltoall"
    qwen = rows["mb2604-h100-qwen3-30b-a3b-fp8-16g-tp1pp1ep16-mbs1"]
    assert qwen.model.kv_channels == 128 and qwen.model.qk_norm and qwen.model.kv_heads == 4
    assert qwen.training.fp8 == "hybrid" and qwen.fp8_recipe == "tensorwise" and qwen.profile.gpu.name == "H100-SXM5-80GB"
    llama = rows["mb2511-gb300-llama31-405b-fp8cs-256g-tp2pp8cp2vp4-mbs1"]
    assert llama.pins.sequence_parallel and llama.training.tp_comm_overlap and llama.pins.etp == 1
    mixtral = rows["mlm-moe-mixtral-8x7b-h100-64g-tp1pp4vp8ep8-mcore09"]
    assert mixtral.training.moe_dispatcher == "alltoall" and not mixtral.training.tp_comm_overlap
    big = moe_layout_rows()
    assert [r.id for r in big] == ["mlm-moe-mixtral-8x22b-h100-128g-tp4pp8vp7ep2-layout-only"]
    assert big[0].pins.etp == 4 and big[0].pins.ep == 2  # unstated etp: Megatron-LM's default, tp


def test_moe_file_bad_input_names_the_run_and_key():
    from orchestrator.calibrate.published import moe_model, moe_row
    from orchestrator.errors import SpecError

    run = next(r for r in _moe_doc()["runs"] if r["model"]["key"] == "deepseek_v3")
    broken = {**run, "model": {**run["model"], "attention": "MLA: q_lora_rank=1536, kv_lora_rank=512"}}
    with pytest.raises(SpecError, match=r"published_runs_moe.yaml: run mb2511-.*: model: .* lacks qk_head_dim\(nope\)"):
        moe_model(broken)
    other = {**run, "hardware": {**run["hardware"], "gpu": "MI300X"}}
    with pytest.raises(SpecError, match=r"hardware.gpu 'MI300X': map it in MOE_GPUS"):
        moe_row(other)


def test_published_layout_only_mixtral_8x22b_plans_and_fits():
    """NVIDIA's recommended Mixtral 8x22B mapping on 128 H100 (TP4 EP2 PP8 VP7, no throughput
    published) is a legal plan and is predicted to fit in 80 GB, as it ran."""
    from orchestrator.calibrate.published import moe_layout_rows

    big = moe_layout_rows()
    assert [r.id for r in big] == ["mlm-moe-mixtral-8x22b-h100-128g-tp4pp8vp7ep2-layout-only"]
    res = search(big[0].model, big[0].training, big[0].profile, big[0].runtime, big[0].pins)
    assert res.best is not None and res.best.fits, [s.memory_gib for s in res.closest]


def test_published_moe_layouts_are_expressible():
    """Every published layout of published_runs_moe.yaml is a legal plan with its pins."""
    from orchestrator.calibrate.published import moe_rows
    from orchestrator.plan.solver import enumerate_layouts

    refused = {}
    for row in moe_rows():
        cand, why = enumerate_layouts(row.model, row.training, row.profile, row.runtime, row.pins)
        if len(cand) == 0:
            refused[row.id] = why
    assert not refused, refused


def test_deepspeed_pipeline_entry_exists_and_resolves():
    """The deepspeed runtime at pp > 1 is DeepSpeed's PipelineEngine: its own entry on A100, fitted
    only on published pipeline-engine runs (published_runs_deepspeed.yaml, use: fit, pp > 1), with
    its held-out figures; on a GPU none of them used it borrows, outside the fitted domain."""
    from orchestrator.costmodel.calibration import engine_of

    assert engine_of("deepspeed", [0, 1, 1, 3], [1, 2, 8, 1]).tolist() == [
        "deepspeed", "deepspeed-pipeline", "deepspeed-pipeline", "deepspeed-zero3"]
    assert engine_of("megatron", [1], [8]).tolist() == ["megatron"]
    a100 = load_profile("dgx-a100-80gb-hdr").profile
    pipe = resolve_efficiency(a100, "deepspeed-pipeline")
    assert pipe.entry == "deepspeed-pipeline/a100-sxm4-hdr" and pipe.domain == "fitted"
    assert pipe.held_out_max is not None and pipe.rows is not None and pipe.rows >= 2
    entry = next(e for e in calibration_table()["entries"] if e["id"] == pipe.entry)
    runs = yaml.safe_load((EXAMPLES.parent / "orchestrator/costmodel/published_runs_deepspeed.yaml").read_text())["runs"]
    fitted = {r["id"] for r in runs if r["use"] == "fit" and r["layout"]["pp"] > 1}
    assert set(entry["held_out_errors"]) == fitted
    h100 = resolve_efficiency(load_profile("dgx16").profile, "deepspeed-pipeline")
    assert h100.domain == "borrowed" and h100.interval is None


def test_borrowed_pipeline_engine_keeps_its_measured_gemm_deficit():
    """On a GPU none of its runs used, the pipeline engine takes ZeRO-3's kernels there at the GEMM
    rate its runs measured against ZeRO-3's on A100, and says so; a profile's own gemm wins."""
    from orchestrator.costmodel.calibration import pipeline_gemm_ratio

    entries = {e["id"]: e for e in calibration_table()["entries"]}
    ratio, origin = pipeline_gemm_ratio(calibration_table())
    pipe_a100, zero3_a100 = entries["deepspeed-pipeline/a100-sxm4-hdr"], entries["deepspeed-zero3/a100-sxm4-hdr"]
    assert ratio == pytest.approx(pipe_a100["efficiency"]["gemm"] / zero3_a100["efficiency"]["gemm"])
    assert 0.3 < ratio < 1.0 and "deepspeed-pipeline/a100-sxm4-hdr" in origin
    h100 = load_profile("dgx16").profile
    pipe, zero3 = resolve_efficiency(h100, "deepspeed-pipeline"), resolve_efficiency(h100, "deepspeed-zero3")
    assert pipe.gemm == pytest.approx(zero3.gemm * ratio) and pipe.attention == zero3.attention
    assert "x " in dict(pipe.sources)["gemm"] and "GEMM rate" in pipe.reason
    # Where the pipeline engine was measured, its own fitted value, unscaled.
    a100 = resolve_efficiency(load_profile("dgx-a100-80gb-hdr").profile, "deepspeed-pipeline")
    assert a100.gemm == pytest.approx(pipe_a100["efficiency"]["gemm"])
    stated = h100.model_copy(update={"efficiency": h100.efficiency.model_copy(update={"gemm": 0.6})})
    assert resolve_efficiency(stated, "deepspeed-pipeline").gemm == pytest.approx(0.6)
