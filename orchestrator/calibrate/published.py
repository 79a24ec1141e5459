"""The published calibration sets, as Rows with their measured step time, one set per engine:

* ``megatron``: the Megatron-LM runs of ``costmodel/published_runs.yaml``, evaluated as
  ``costmodel/calibration_sets.yaml`` describes;
* ``deepspeed-zero3``: the PyTorch FSDP FULL_SHARD runs (torchtitan, MosaicML llm-foundry) of
  ``costmodel/published_runs_fsdp.yaml`` (a copy of ../shared/reference/calibration_runs_fsdp.yaml),
  ZeRO-3 semantics, with their published peak memory where there is one; and DeepSpeed's own
  ZeRO-3 runs of ``costmodel/published_runs_deepspeed.yaml``;
* ``megatron`` again: the mixture-of-experts and recent dense runs of Megatron-Core and
  Megatron-Bridge on H100, GB200 NVL72 and GB300 NVL72 of ``costmodel/published_runs_moe.yaml`` (a copy
  of ../shared/reference/calibration_runs_moe.yaml), read by ``moe_rows``.

``scripts/fit_calibration.py`` fits each (engine, hardware) entry to its own rows only."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any, Literal

import yaml

from orchestrator.calibrate.rows import Row, RowError, row_errors
from orchestrator.costmodel.calibration import engine_of
from orchestrator.errors import SpecError
from orchestrator.plan.layout import Pins
from orchestrator.runtimes import DEEPSPEED, MEGATRON, Engine, runtime_named
from orchestrator.spec.cluster import ClusterProfile, Features, load_profile
from orchestrator.spec.model import MLASpec, ModelSpec, MoESpec
from orchestrator.spec.training import TrainingSpec
from orchestrator.spec.yamlio import deep_merge

# Which GPUs and fabric each hardware id of the calibration entries describes (written into
# calibration.yaml by scripts/fit_calibration.py). H200 has the H100's Hopper compute (same SMs and
# clocks, dense peak 989 TFLOP/s); its larger, faster HBM3e is a physical parameter of its profile
# (hbm_bandwidth_gbps), not an efficiency.
HARDWARE = {
    "a100-sxm4-hdr": {
        "gpus": ["A100-SXM4-80GB", "A100-SXM4-40GB", "A100-80GB", "A100"],
        "inter_node": "infiniband",
        "description": "A100 SXM4 + NVLink 3/NVSwitch, HDR InfiniBand (Selene)",
    },
    "h100-sxm5-ndr": {
        "gpus": ["H100-SXM5-80GB", "H100", "H100-80GB", "H200-SXM-141GB", "H200"],
        "inter_node": "infiniband",
        "description": "H100/H200 SXM + NVLink 4/NVSwitch, NDR InfiniBand (DGX H100 / HGX H200)",
    },
    # Blackwell. The HGX/DGX B200 runs the same GPU at 1,000 W instead of 1,200 W: its lower peak is a
    # physical parameter of its profile (dgx-b200), and it shares this entry's efficiencies as H200
    # shares H100's, outside the fitted domain (no published run here was measured on it).
    "gb200-nvl72": {
        "gpus": ["GB200", "B200-SXM-180GB", "B200"],
        "inter_node": "infiniband",
        "description": "B200 in GB200 NVL72 racks (72-GPU NVLink 5 domains), InfiniBand between racks; HGX B200",
    },
    "gb300-nvl72": {
        "gpus": ["GB300"],
        "inter_node": "infiniband",
        "description": "Blackwell Ultra in GB300 NVL72 racks (72-GPU NVLink 5 domains), ConnectX-8 between racks",
    },
}


def _hardware_of(gpu_name: str) -> str:
    return next(hw for hw, spec in HARDWARE.items() if gpu_name in spec["gpus"])


def _data(name: str) -> dict:
    return yaml.safe_load(resources.files("orchestrator.costmodel").joinpath(name).read_text(encoding="utf-8"))


def step_time_from_tflops(
    formula: str, B: int, s: int, layers: int, h: int, V: int, gpus: int, tflops_per_gpu: float
) -> float:
    """Published TFLOP/s per GPU back to seconds per step with the source's own FLOP count."""
    if formula.startswith("F = 96"):  # Narayanan et al. 2021, Eq. 3 (with the recompute forward)
        F = 96 * B * s * layers * h**2 * (1 + s / (6 * h) + V / (16 * layers * h))
    elif formula.startswith("F = 72"):  # Megatron-LM r0.8 num_floating_point_operations, 4h GeLU, MHA
        F = 72 * B * s * layers * h**2 * (1 + s / (6 * h) + V / (12 * h * layers))
    else:
        raise ValueError(f"unknown FLOPs formula {formula!r}")
    return F / (gpus * tflops_per_gpu * 1e12)


def published_rows(profile_loader=load_profile) -> list[Row]:
    """Every published run as a Row, evaluated as calibration_sets.yaml describes."""
    runs = _data("published_runs.yaml")["runs"]
    out: list[Row] = []
    for cs in _data("calibration_sets.yaml")["sets"]:
        base_profile = profile_loader(cs["profile"]).profile
        eng = Engine(**cs["engine"])
        mcfg, tcfg, lcfg = cs["model"], cs["training"], cs["layout"]
        for run in runs:
            if not run["id"].startswith(cs["runs_prefix"]):
                continue
            entries = run.get("rows") or [run]
            for r in entries:
                m = r.get("model") if isinstance(r.get("model"), dict) else r
                h, layers, heads = int(m["hidden"]), int(m["layers"]), int(m["heads"])
                rid = run["id"] if "rows" not in run else f"{run['id']}_{r['model']}"
                tp, pp = int(r["tp"]), int(r["pp"])
                dp = int(r.get("dp") or r.get("derived_dp"))
                gpus = int(r["gpus"])
                B = int(r["global_batch"])
                tflops = float(r["tflops_per_gpu"] if "tflops_per_gpu" in r else r["reported"]["tflops_per_gpu"])
                model = ModelSpec(
                    num_layers=layers,
                    hidden_size=h,
                    ffn_hidden_size=mcfg["ffn_multiplier"] * h,
                    num_attention_heads=heads,
                    vocab_size=cs["vocab"],
                    activation=mcfg["activation"],
                    tied_embeddings=mcfg["tied_embeddings"],
                    normalization=mcfg["normalization"],
                    position_embedding=mcfg["position_embedding"],
                    bias=mcfg["bias"],
                    max_position_embeddings=tcfg["seq_length"],
                )
                training = TrainingSpec(global_batch_size=B, **tcfg)
                mbs = r.get("micro_batch_sc21_script")
                per_virtual = r.get("vpp_layers_per_virtual_stage_sc21_script")
                vpp = None
                if "micro_batch_sc21_script" in r:
                    vpp = 1 if per_virtual is None else layers // pp // int(per_virtual)
                pins = Pins(
                    tp=tp,
                    pp=pp,
                    dp=dp,
                    vpp=vpp,
                    micro_batch_size=mbs,
                    zero_stage=lcfg.get("zero_stage"),
                    recompute=lcfg.get("recompute"),
                    sequence_parallel=lcfg.get("sequence_parallel"),
                )
                step = step_time_from_tflops(
                    cs["flops_formula"], B, training.seq_length, layers, h, cs["vocab"], gpus, tflops
                )
                out.append(
                    Row(
                        rid,
                        model,
                        training,
                        base_profile.resized(nodes=gpus // base_profile.gpus_per_node),
                        runtime_named(cs["runtime"]),
                        pins,
                        step,
                        eng,
                        hardware=f"megatron/{cs['hardware']}",
                    )
                )
    return out


def _fsdp_profiles(doc: dict, profile_loader) -> dict[str, ClusterProfile]:
    out = {}
    for name, override in doc["profiles"].items():
        base = profile_loader(override["extends"]).profile
        data = deep_merge(base.model_dump(), {k: v for k, v in override.items() if k != "extends"})
        out[name] = ClusterProfile.model_validate({**data, "name": name, "extends": None})
    return out


def fsdp_rows(profile_loader=load_profile) -> list[Row]:
    """The published FSDP FULL_SHARD runs as ZeRO-3 rows of the deepspeed runtime. torchtitan's
    'selective' is its per-op SAC (every second mm recomputed), evaluated as such
    (``evaluate.RC_TORCHTITAN_OP``), not as Korthikanti's selective recomputation."""
    doc = _data("published_runs_fsdp.yaml")
    profiles = _fsdp_profiles(doc, profile_loader)
    out = []
    for r in doc["runs"]:
        L = r["layout"]
        torchtitan_op = L["recompute"] == "selective" and "torchtitan" in L["framework"]
        out.append(_run_row(r, profiles[r["profile"]], "op" if torchtitan_op else L["recompute"], note="fsdp"))
    return out


def _run_row(r: dict, base: ClusterProfile, recompute: str, note: str = "") -> Row:
    """A published run record (id, model, training, n_gpus, layout, measured, optional
    measured_memory_gib) as a row of its engine's entry, on ``base`` resized to its GPU count."""
    profile = base.resized(nodes=max(1, r["n_gpus"] // base.gpus_per_node))
    L = r["layout"]
    pins = Pins(
        tp=L["tp"],
        pp=L["pp"],
        dp=L["dp"],
        vpp=L.get("vpp", 1),
        zero_stage=L["zero"],
        micro_batch_size=L["mbs"],
        recompute=recompute,
        sequence_parallel=L["sp"],
    )
    runtime = runtime_named(r.get("runtime", DEEPSPEED.name))
    engine = str(engine_of(runtime, L["zero"], L["pp"]).item())
    return Row(
        r["id"],
        ModelSpec(**r["model"]),
        TrainingSpec(**r["training"]),
        profile,
        runtime,
        pins,
        float(r["measured"]["step_time_s"]),
        measured_peak_gib=r.get("measured_memory_gib"),
        hardware=f"{engine}/{_hardware_of(profile.gpu.name)}",
        note=note,
    )


def deepspeed_rows(profile_loader=load_profile) -> list[Row]:
    """The DeepSpeed-engine runs of published_runs_deepspeed.yaml marked ``use: fit`` (ZeRO-3 ones
    join the deepspeed-zero3 entry of their GPU)."""
    return [
        _run_row(r, profile_loader(r["profile"]).profile, r["layout"]["recompute"])
        for r in _data("published_runs_deepspeed.yaml")["runs"]
        if r["use"] == "fit"
    ]


# ---- published_runs_moe.yaml: Megatron-Core / Megatron-Bridge MoE and recent dense runs ----------

MOE_FILE = "published_runs_moe.yaml"
# The GPU each run names -> (calibration hardware id, shipped profile it ran on as resized to its
# GPU count). H100: DGX H100 with 8x NDR 400 Gb/s (Megatron-LM MoE README "Detailed Benchmark
# Information": "8xH100 80GB HBM3 servers ... InfiniBand 8x400 Gbit/s"; Megatron-Bridge: DGX-H100).
MOE_GPUS = {
    "H100-SXM5-80GB": ("h100-sxm5-ndr", "dgx16"),
    "GB200 (NVL72)": ("gb200-nvl72", "gb200-nvl72"),
    "GB300 (NVL72)": ("gb300-nvl72", "gb300-nvl72"),
}
# Megatron-Bridge's MoE performance recipes for these models dispatch through Megatron-Core's flex
# dispatcher with the HybridEP backend (scripts/performance/configs/{qwen,deepseek}/*_workload_base_configs.py
# at the 25.11 summary's commit 5776a6d: moe_flex_dispatcher_backend="hybridep" for GB200/GB300, and
# the 26.04 H100 Qwen3-30B-A3B row's preset, recipe_crossref); the rows run on a profile whose
# features.deepep is true. GPT-OSS keeps its provider's alltoall (gpt_oss_provider.py
# moe_token_dispatcher_type "alltoall"; its presets name no backend) and Mixtral's README says All-to-All.
FLEX_MODELS = ("qwen3_30b_a3b", "qwen3_235b_a22b", "deepseek_v3")
# Transformer Engine FP8 as Megatron-Bridge's precision presets set it (src/megatron/bridge/training/
# mixed_precision.py): fp8_cs = bf16_with_fp8_current_scaling_mixed (fp8 "hybrid", recipe
# "tensorwise"); fp8_mx = bf16_with_mxfp8_mixed (fp8 "e4m3", recipe "mxfp8", blocks of 32 values with
# one E8M0 scale), the recipe each row's training.fp8_recipe carries.
FP8: dict[str, tuple[Literal["hybrid", "e4m3"], Literal["tensorwise", "mxfp8"]]] = {
    "fp8_cs": ("hybrid", "tensorwise"),
    "fp8_mx": ("e4m3", "mxfp8"),
    # The 26.04 H100 row prints "FP8" without a recipe; its preset (recipe_crossref) is FP8_CS.
    "fp8": ("hybrid", "tensorwise"),
}


@dataclass(frozen=True)
class Skipped:
    """A run of published_runs_moe.yaml that is not a calibration row, and why."""

    id: str
    reason: str


def _moe_where(run: dict, key: str) -> str:
    return f"{MOE_FILE}: run {run.get('id', '?')}: {key}"


def _number(text: str, pattern: str, where: str) -> float:
    m = re.search(pattern, text)
    if m is None:
        raise SpecError(f"{where}: {text!r} does not state {pattern!r}; write it into the string or drop the feature")
    return float(m.group(1))


def _mla(attention: str, where: str) -> MLASpec:
    """DeepSeek-V3's MLA from the run's attention string (Megatron-LM's names: --qk-head-dim is the
    part without RoPE, --qk-pos-emb-head-dim the rotary part)."""
    values = {k: int(v) for k, v in re.findall(r"(\w+(?:\(\w+\))?)=(\d+)", attention)}
    names = {
        "q_lora_rank": "q_lora_rank",
        "kv_lora_rank": "kv_lora_rank",
        "qk_nope_head_dim": "qk_head_dim(nope)",
        "qk_rope_head_dim": "qk_pos_emb_head_dim(rope)",
        "v_head_dim": "v_head_dim",
    }
    missing = [v for v in names.values() if v not in values]
    if missing:
        raise SpecError(f"{where}: the MLA string {attention!r} lacks {', '.join(missing)}; state each as name=value")
    return MLASpec(**{field: values[key] for field, key in names.items()})


def _attention_fields(m: dict, where: str) -> dict[str, Any]:
    """What the attention string says beyond GQA: MLA, Qwen3's QK-layernorm, GPT-OSS's sliding window
    (Megatron-Core window_size (128, 0): 128 tokens back, none ahead) on every layer but each
    window_attn_skip_freq-th, and its learnable softmax offset (attention sinks)."""
    text = str(m["attention"])
    out: dict[str, Any] = {"qk_norm": "QK-layernorm" in text, "attention_sinks": "attention sinks" in text}
    if text.startswith("MLA:"):
        out["mla"] = _mla(text, where)
    if "sliding window" in text:
        out["sliding_window"] = int(_number(text, r"sliding window \((\d+),\s*0\)", where))
        if "alternating" in text:
            out["global_attention_every"] = int(_number(text, r"window_attn_skip_freq=(\d+)", where))
    return out


def _activation_fields(m: dict, where: str) -> dict[str, Any]:
    """swiglu, or GPT-OSS's gated quick-GELU with its clamp and linear offset; 'linear biases on'."""
    text = str(m["activation"])
    out: dict[str, Any] = {"bias": "linear biases on" in text}
    if text.startswith("swiglu"):
        out["activation"] = "swiglu"
    elif "quick_gelu" in text:
        out["activation"] = "quick_geglu"
        out["activation_clamp"] = _number(text, r"clamp ([0-9.]+)", where)
        out["glu_linear_offset"] = _number(text, r"glu_linear_offset ([0-9.]+)", where)
    else:
        raise SpecError(f"{where}: activation {text!r} is neither swiglu nor a gated quick_gelu; map it here")
    return out


def _router_fields(m: dict, where: str) -> dict[str, Any]:
    """DeepSeek-V3's router string: sigmoid scores, grouped top-k and its scale, the expert bias of
    auxiliary-loss-free balancing, which DeepSeek-V3 pairs with a small sequence-wise auxiliary loss
    (DeepSeek-V3 report Sec. 2.1.2; Megatron-Bridge DeepSeekV3ModelProvider: seq_aux_loss, 1e-4).
    Without a router string: Megatron-Core's softmax top-k with its auxiliary loss. Neither the
    loss nor its coefficient changes the work of a step."""
    text = m.get("router")
    if text is None:
        return {}
    out: dict[str, Any] = {"router": "sigmoid" if "sigmoid" in text else "softmax"}
    if "groups" in text:
        out["groups"] = int(_number(text, r"(\d+) groups", where))
        out["group_top_k"] = int(_number(text, r"group_topk (\d+)", where))
    if "topk_scaling" in text:
        out["scale"] = _number(text, r"topk_scaling ([0-9.]+)", where)
    if "expert bias" in text:
        out["expert_bias"] = True
    if "aux-loss-free" in text:
        out["load_balancing"], out["aux_loss_coeff"] = "seq_aux_loss", 1e-4
    return out


def _moe_spec(m: dict, where: str) -> MoESpec | None:
    if m["type"] == "dense":
        return None
    shared = int(m.get("num_shared_experts") or 0)
    return MoESpec(
        num_experts=int(m["num_experts"]),
        top_k=int(m["moe_top_k"]),
        ffn_hidden_size=int(m["moe_ffn_hidden_size"]),
        shared_experts=shared,
        # Megatron-LM's --moe-shared-expert-intermediate-size: all shared experts together.
        shared_ffn_hidden_size=int(m["shared_expert_ffn_hidden_size"]) if shared else None,
        dense_leading_layers=int(m.get("dense_leading_layers") or 0),
        **_router_fields(m, where),
    )


def moe_model(run: dict) -> ModelSpec:
    """A run's model as a ModelSpec. DeepSeek-V3 trained without its multi-token-prediction module
    (the table's label "DeepSeekV3 (w/o MTP)"; the checkpoint's one MTP layer,
    mtp_layers_in_hf_checkpoint, is not in these runs)."""
    m, where = run["model"], _moe_where(run, "model")
    if m["type"] not in ("dense", "moe"):
        raise SpecError(f"{where}.type {m['type']!r}: write dense or moe")
    mtp = 0 if "w/o MTP" in m.get("table_name", "") else int(m.get("mtp_layers_in_hf_checkpoint") or 0)
    mla = str(m["attention"]).startswith("MLA:")
    try:
        return ModelSpec(
            num_layers=int(m["num_layers"]),
            hidden_size=int(m["hidden_size"]),
            ffn_hidden_size=int(m["ffn_hidden_size"]),
            num_attention_heads=int(m["num_attention_heads"]),
            num_kv_heads=None if mla else int(m["num_kv_heads"]),
            kv_channels=m.get("kv_channels"),
            vocab_size=int(m["vocab_size"]),
            tied_embeddings=bool(m["tied_embeddings"]),
            moe=_moe_spec(m, where),
            mtp_layers=mtp,
            **_attention_fields(m, where),
            **_activation_fields(m, where),
        )
    except (KeyError, ValueError) as e:  # pydantic's ValidationError is a ValueError
        raise SpecError(f"{where}: {e}; fix the run's model section") from e


def moe_training(run: dict) -> tuple[TrainingSpec, str | None]:
    """A run's TrainingSpec and its FP8 recipe. Megatron-Bridge's recipes turn on Transformer Engine's
    TP overlap (CommOverlapConfig(tp_comm_overlap=True); it applies only with tp > 1), reduce
    gradients in bf16 and, for the
    MoE models, grouped GEMM; none of these runs overlaps the expert all-to-all with compute
    (moe_a2a_overlap False in the GB200/GB300 presets, absent before MCore 0.13 for Mixtral)."""
    t, m = run["training"], run["model"]
    precision = str(t["precision"]).split()[0]
    if precision != "bf16" and precision not in FP8:
        raise SpecError(f"{_moe_where(run, 'training.precision')} {precision!r}: write bf16, fp8_cs or fp8_mx")
    fp8, recipe = FP8[precision] if precision in FP8 else (None, None)
    bridge = run["source"]["repo"].endswith("Megatron-Bridge")
    moe: dict[str, Any] = {}
    if m["type"] == "moe":
        flex = bridge and m["key"] in FLEX_MODELS
        moe = {"moe_dispatcher": "flex" if flex else "alltoall", "moe_grouped_gemm": True, "moe_overlap_ep_comm": False}
    training = TrainingSpec(
        seq_length=int(t["seq_length"]),
        global_batch_size=int(t["global_batch_size"]),
        precision="bf16",
        fp8=fp8,
        fp8_recipe=recipe or "delayed",
        tp_comm_overlap=bridge,
        # Every Megatron-Bridge performance config reduces gradients in bf16 (scripts/performance/
        # configs/*/*_llm_pretrain.py: cfg.ddp.grad_reduce_in_fp32 = False at 5776a6d, the 25.11
        # rows', and at 74695a0 for the 26.04 Qwen3 row): a 2-byte gradient buffer and half the
        # reduce-scatter bytes (Megatron-LM --grad-reduce-in-bf16). The shipped fit was made with
        # fp32 rows; its recorded errors still hold to 0.2 % (test_calibration_file_is_current).
        grad_reduce_in_fp32=not bridge,
        # Bridge's FP8 presets keep FP8 weights only (mixed_precision.py at 5776a6d:
        # bf16_with_fp8_current_scaling_mixed and bf16_with_mxfp8_mixed set fp8_param_gather = True).
        fp8_param_gather=bridge and fp8 is not None,
        **moe,
    )
    return training, recipe


def moe_pins(run: dict, model: ModelSpec) -> Pins:
    """The published layout as pins. Every recipe runs Megatron-Core's distributed optimizer
    (zero_stage 1: Megatron-Bridge recipes use_distributed_optimizer=True; Megatron-LM's
    examples/mixtral/train_mixtral_8x7b_distributed.sh --use-distributed-optimizer) and sequence
    parallelism with tp > 1 (the recipes' sequence_parallel=True, the Mixtral script's
    --sequence-parallel). An unstated expert-TP degree is Megatron-LM's default, tp
    (megatron/training/arguments.py validate_args: "if args.expert_tensor_parallel_size is None:
    args.expert_tensor_parallel_size = args.tensor_model_parallel_size"); a dense model has none.
    An unstated recompute is none: the Qwen3 and GPT-OSS recipes set recompute_granularity None,
    and DeepSeek-V3's selective recompute of single modules (mla_up_proj, moe_act) is not one of
    dsorch's recompute modes."""
    L, where = run["layout"], _moe_where(run, "layout")
    tp, pp, cp, dp = (int(L[k]) for k in ("tp", "pp", "cp", "dp"))
    if tp * pp * cp * dp != int(run["hardware"]["num_gpus"]):
        raise SpecError(f"{where}: tp*pp*cp*dp = {tp * pp * cp * dp} is not num_gpus {run['hardware']['num_gpus']}")
    ep = int(L["ep"] or 1)
    etp = (tp if L["etp"] is None else int(L["etp"])) if model.moe is not None else 1
    return Pins(
        tp=tp,
        pp=pp,
        cp=cp,
        dp=dp,
        vpp=int(L["vp"] or 1),
        ep=ep,
        etp=etp,
        zero_stage=1,
        micro_batch_size=int(run["training"]["micro_batch_size"]),
        recompute=L["recompute"] or "none",
        sequence_parallel=tp > 1,
    )


def moe_skip_reason(run: dict) -> str | None:
    """Why a run is not a calibration row (None: it is one)."""
    if run["measured"].get("step_time_s") is None:
        return "layout only: no throughput published (kept as a layout that must stay expressible)"
    if run["layout"]["fsdp"]:
        return (
            "Megatron-FSDP with data_parallel_sharding_strategy optim_grads_params (Megatron-Bridge "
            "scripts/performance/utils/overrides.py _set_megatron_fsdp_overrides), i.e. ZeRO-3 on the megatron "
            "runtime, which dsorch does not model (runtimes/megatron.py zero_stages); its preset also offloads 20 "
            "layers' activations to the CPU (cpu_offloading_num_layers)"
        )
    return None


def moe_row(run: dict, profile_loader=load_profile) -> Row:
    """One run of published_runs_moe.yaml as a megatron row on its shipped profile resized to its GPU
    count (measured_step_s NaN for a layout-only run)."""
    hw = run["hardware"]
    if hw["gpu"] not in MOE_GPUS:
        raise SpecError(f"{_moe_where(run, 'hardware.gpu')} {hw['gpu']!r}: map it in MOE_GPUS ({', '.join(MOE_GPUS)})")
    hardware, profile_name = MOE_GPUS[hw["gpu"]]
    base = profile_loader(profile_name).profile
    if int(hw["gpus_per_node"]) != base.gpus_per_node or int(hw["num_gpus"]) % base.gpus_per_node:
        raise SpecError(
            f"{_moe_where(run, 'hardware')}: {hw['num_gpus']} GPUs, {hw['gpus_per_node']} per node, "
            f"do not fill nodes of profile {profile_name} ({base.gpus_per_node} per node)"
        )
    model = moe_model(run)
    training, recipe = moe_training(run)
    profile = base.resized(nodes=int(hw["num_gpus"]) // base.gpus_per_node)
    if training.moe_dispatcher == "flex":  # HybridEP / DeepEP installed where the run was made
        profile = profile.model_copy(update={"features": Features(deepep=True)})
    engine = MEGATRON.engine_for(training)
    scope = ((run.get("recipe_crossref") or {}).get("preset_fields") or {}).get("cuda_graph_scope") or []
    if {"moe_router", "moe_preprocess"} <= set(scope):
        # The preset captures the router and the dispatcher's preprocessing in CUDA graphs
        # (cuda_graph_impl transformer_engine): no host work per MoE layer.
        engine = replace(engine, moe_cuda_graphs=True)
    if run["model"]["key"] == "deepseek_v3" and recipe == "mxfp8":
        # deepseek_llm_pretrain.py (5776a6d): with fp8_mx "keeping this enabled causes NaN grad norm",
        # so overlap_param_gather is off for DeepSeek-V3 in MXFP8.
        engine = replace(engine, param_gather_overlap=False)
    step = run["measured"].get("step_time_s")
    return Row(
        run["id"],
        model,
        training,
        profile,
        MEGATRON,
        moe_pins(run, model),
        math.nan if step is None else float(step),
        engine,
        hardware=f"megatron/{hardware}",
    )


def moe_runs(profile_loader=load_profile) -> tuple[list[Row], list[Skipped]]:
    """The runs of published_runs_moe.yaml with a step time dsorch can model, and the others with why."""
    rows, skipped = [], []
    for run in _data(MOE_FILE)["runs"]:
        reason = moe_skip_reason(run)
        if reason is None:
            rows.append(moe_row(run, profile_loader))
        else:
            skipped.append(Skipped(run["id"], reason))
    return rows, skipped


def moe_rows(profile_loader=load_profile) -> list[Row]:
    """The calibration rows of published_runs_moe.yaml (``moe_runs`` says what it leaves out)."""
    return moe_runs(profile_loader)[0]


def moe_layout_rows(profile_loader=load_profile) -> list[Row]:
    """The layout-only runs (no throughput) as rows with a NaN step time: their layouts must stay
    legal plans (Mixtral 8x22B, NVIDIA's recommended mapping on 128 H100)."""
    runs = _data(MOE_FILE)["runs"]
    return [moe_row(r, profile_loader) for r in runs if r["measured"].get("step_time_s") is None]


def all_published_rows() -> list[Row]:
    """Every engine's published rows."""
    return [*published_rows(), *fsdp_rows(), *deepspeed_rows(), *moe_rows()]


def published_errors() -> list[RowError]:
    """The model with the shipped calibration against every published run, each with its own
    engine's entry."""
    return row_errors(all_published_rows())
