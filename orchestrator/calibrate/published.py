"""The published calibration set: the Megatron-LM runs of ``costmodel/published_runs.yaml``,
evaluated as ``costmodel/calibration_sets.yaml`` describes, as Rows with their measured step time.
``scripts/fit_calibration.py`` fits each hardware entry's efficiencies to them."""

from __future__ import annotations

from importlib import resources

import yaml

from ..costmodel.evaluate import Engine
from ..solver import Pins
from ..specs import ModelSpec, TrainingSpec, load_profile
from .rows import Row, RowError, row_errors

def _data(name: str) -> dict:
    return yaml.safe_load(resources.files("orchestrator.costmodel").joinpath(name).read_text(encoding="utf-8"))


def step_time_from_tflops(formula: str, B: int, s: int, layers: int, h: int, V: int, gpus: int,
                          tflops_per_gpu: float) -> float:
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
                model = ModelSpec(num_layers=layers, hidden_size=h, ffn_hidden_size=mcfg["ffn_multiplier"] * h,
                                  num_attention_heads=heads, vocab_size=cs["vocab"], activation=mcfg["activation"],
                                  tied_embeddings=mcfg["tied_embeddings"], normalization=mcfg["normalization"],
                                  position_embedding=mcfg["position_embedding"], bias=mcfg["bias"],
                                  max_position_embeddings=tcfg["seq_length"])
                training = TrainingSpec(global_batch_size=B, **tcfg)
                mbs = r.get("micro_batch_sc21_script")
                per_virtual = r.get("vpp_layers_per_virtual_stage_sc21_script")
                vpp = None
                if "micro_batch_sc21_script" in r:
                    vpp = 1 if per_virtual is None else layers // pp // int(per_virtual)
                pins = Pins(tp=tp, pp=pp, dp=dp, vpp=vpp, micro_batch_size=mbs, zero_stage=lcfg.get("zero_stage"),
                            recompute=lcfg.get("recompute"), sequence_parallel=lcfg.get("sequence_parallel"))
                step = step_time_from_tflops(cs["flops_formula"], B, training.seq_length, layers, h, cs["vocab"], gpus,
                                             tflops)
                out.append(Row(rid, model, training, base_profile.resized(nodes=gpus // base_profile.gpus_per_node),
                               cs["runtime"], pins, step, eng, hardware=cs["hardware"]))
    return out


def published_errors() -> list[RowError]:
    """The model with the shipped calibration against every published run."""
    return row_errors(published_rows())
