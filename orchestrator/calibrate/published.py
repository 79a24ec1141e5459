"""The published calibration sets, as Rows with their measured step time, one set per engine:

* ``megatron``: the Megatron-LM runs of ``costmodel/published_runs.yaml``, evaluated as
  ``costmodel/calibration_sets.yaml`` describes;
* ``deepspeed-zero3``: the PyTorch FSDP FULL_SHARD runs (torchtitan, MosaicML llm-foundry) of
  ``costmodel/published_runs_fsdp.yaml`` (a copy of ../shared/reference/calibration_runs_fsdp.yaml),
  ZeRO-3 semantics, with their published peak memory where there is one; and DeepSpeed's own
  ZeRO-3 runs of ``costmodel/published_runs_deepspeed.yaml``.

``scripts/fit_calibration.py`` fits each (engine, hardware) entry to its own rows only."""

from __future__ import annotations

from importlib import resources

import yaml

from orchestrator.calibrate.rows import Row, RowError, row_errors
from orchestrator.costmodel.calibration import engine_of
from orchestrator.costmodel.evaluate import Engine
from orchestrator.plan.layout import Pins
from orchestrator.spec.cluster import ClusterProfile, load_profile
from orchestrator.spec.model import ModelSpec, TrainingSpec
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
                        cs["runtime"],
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
    runtime = r.get("runtime", "deepspeed")
    engine = str(engine_of(runtime, L["zero"]).item())
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


def all_published_rows() -> list[Row]:
    """Every engine's published rows."""
    return [*published_rows(), *fsdp_rows(), *deepspeed_rows()]


def published_errors() -> list[RowError]:
    """The model with the shipped calibration against every published run, each with its own
    engine's entry."""
    return row_errors(all_published_rows())
