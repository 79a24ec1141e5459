"""Fit the time model's efficiencies to the published Megatron-LM runs and write them as data.

    python scripts/fit_calibration.py            # fit, write orchestrator/costmodel/calibration.yaml, print the table
    python scripts/fit_calibration.py --check    # only print the table for the shipped calibration.yaml

Each hardware entry (GPU + fabric) is fitted to the rows measured on it (calibration_sets.yaml
says which): the objective is mean + max relative step-time error, every efficiency bounded to a
physical range (orchestrator.calibrate.BOUNDS). Overlap fractions that a set cannot identify (the
2021 SC21 runs overlapped nothing) are taken from the entry that can. The per-row table printed at
the end is the one tests/test_calibration.py asserts on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.calibrate import error_summary, error_table, fit, published_errors, published_rows  # noqa: E402
from orchestrator.costmodel.calibration import FIELDS  # noqa: E402

OUT = ROOT / "orchestrator" / "costmodel" / "calibration.yaml"

# Which GPUs and fabric each fitted entry describes. H200 has the H100's Hopper compute (same
# SMs and clocks, dense peak 989 TFLOP/s); its larger, faster HBM3e is a physical parameter of
# its profile (hbm_bandwidth_gbps), not an efficiency.
HARDWARE = {
    "a100-sxm4-hdr": {"gpus": ["A100-SXM4-80GB", "A100-SXM4-40GB", "A100-80GB", "A100"],
                      "inter_node": "infiniband", "free": ("gemm", "hbm", "intra_node_comm", "inter_node_comm"),
                      # SC21 ran without FlashAttention: its efficiency is not identifiable there.
                      # FlashAttention-2 reaches 50-73% of A100 peak (Dao 2023, abstract).
                      "fixed": {"attention": 0.6},
                      "description": "A100 SXM4 + NVLink 3/NVSwitch, HDR InfiniBand (Selene)"},
    "h100-sxm5-ndr": {"gpus": ["H100-SXM5-80GB", "H100", "H100-80GB", "H200-SXM-141GB", "H200"],
                      "inter_node": "infiniband", "free": FIELDS,
                      "description": "H100/H200 SXM + NVLink 4/NVSwitch, NDR InfiniBand (DGX H100 / HGX H200)"},
}
START = {"gemm": 0.8, "attention": 0.5, "hbm": 0.8, "intra_node_comm": 0.8, "inter_node_comm": 0.8, "dp_overlap": 0.8,
         "tp_overlap": 0.5}

HEADER = """\
# Fitted efficiencies of dsorch's time model, per GPU and fabric. Written by
#     python scripts/fit_calibration.py
# from published Megatron-LM runs (published_runs.yaml, evaluated as calibration_sets.yaml says).
# Do not edit by hand: change the model or the sets and re-run the script.
#
# Resolution (orchestrator/costmodel/calibration.py): a profile's own `efficiency` values win;
# then the first entry below whose `gpus` contains the profile's gpu.name and whose `inter_node`
# matches its inter_node.kind; then one matching the GPU alone; then `default`.
#
# What transfers to DeepSpeed's pipeline engine: gemm and hbm (kernel efficiencies of the GPU),
# intra/inter_node_comm (what NCCL reaches on the links). What does not: the overlaps are the
# engine's. DeepSpeed's engine reduces gradients after the pipeline flush (no overlap with pp > 1),
# has no TP overlap, no interleaved schedule and sends whole activations between stages; the cost
# model applies those rules per runtime (costmodel/evaluate.py ENGINES), using dp_overlap only
# where the engine overlaps at all.
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="print the error table of the shipped calibration only")
    ap.add_argument("--iters", type=int, default=300)
    args = ap.parse_args()
    if args.check:
        print(error_table(published_errors()))
        return

    rows = published_rows()
    fitted: dict[str, dict] = {}
    # Fit the entry that identifies the most parameters first; the others borrow what they cannot see.
    for hw in sorted(HARDWARE, key=lambda k: -len(HARDWARE[k]["free"])):
        spec = HARDWARE[hw]
        hw_rows = [r for r in rows if r.hardware == hw]
        start = dict(START)
        for other in fitted.values():
            start.update({f: other["efficiency"][f] for f in FIELDS if f not in spec["free"]})
        start.update(spec.get("fixed", {}))
        res = fit(hw_rows, start, tuple(spec["free"]), iters=args.iters, restarts=3)
        summary = error_summary(res.errors)
        fitted[hw] = {"values": res.values, "efficiency": {f: round(res.values[f], 4) for f in FIELDS},
                      "summary": summary, "rows": res.errors}
        print(f"{hw}: " + ", ".join(f"{f}={res.values[f]:.4f}" for f in FIELDS)
              + f"  mean {100 * summary['mean']:.2f}% max {100 * summary['max']:.2f}%", flush=True)

    entries = []
    for hw in HARDWARE:
        spec, fz = HARDWARE[hw], fitted[hw]
        entries.append({
            "id": hw, "description": spec["description"], "gpus": spec["gpus"], "inter_node": spec["inter_node"],
            "fitted": list(spec["free"]),
            **({"fixed_from_literature": spec["fixed"]} if spec.get("fixed") else {}),
            "efficiency": fz["efficiency"],
            "step_time_error": {"rows": fz["summary"]["rows"], "mean": round(fz["summary"]["mean"], 4),
                                "max": round(fz["summary"]["max"], 4)},
        })
    # Unknown hardware: the less favourable of the fitted values, and the larger of the errors.
    default = {f: min(e["efficiency"][f] for e in entries) for f in FIELDS}
    doc = {"version": 1,
           "default": {"efficiency": default,
                       "step_time_error": {"mean": max(e["step_time_error"]["mean"] for e in entries),
                                           "max": max(e["step_time_error"]["max"] for e in entries)}},
           "hardware": entries}
    OUT.write_text(HEADER + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=110))
    from orchestrator.costmodel.calibration import calibration_table

    calibration_table.cache_clear()
    print(f"wrote {OUT.relative_to(ROOT)}\n")
    print(error_table(published_errors()))


if __name__ == "__main__":
    main()
