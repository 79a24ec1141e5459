"""The published runs (orchestrator/calibrate/published.py and costmodel/published_runs*.yaml): each
is sourced, read into rows as published (models, layouts, step times from TFLOP/s), and each
published layout is a legal plan."""

from __future__ import annotations

import pytest
import yaml

from orchestrator.calibrate import (
    published_rows,
    step_time_from_tflops,
)
from orchestrator.plan.solver import search
from orchestrator.runtimes import MEGATRON


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
        assert row.runtime is MEGATRON and row.measured_step_s == run["measured"]["step_time_s"]
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
