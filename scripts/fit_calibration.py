"""Fit the time model's efficiencies to published runs, per engine and hardware, and write them as data.

    python scripts/fit_calibration.py            # fit, write orchestrator/costmodel/calibration.yaml, print the tables
    python scripts/fit_calibration.py --check    # only print the per-engine tables of the shipped calibration.yaml

Each entry is one engine on one kind of hardware (GPU + fabric), fitted only to the runs of that
engine measured on it: Megatron-LM (published_runs.yaml as calibration_sets.yaml says) and
ZeRO-3/FSDP (published_runs_fsdp.yaml). The objective is mean + max relative step-time error,
every efficiency bounded to a physical range (orchestrator.calibrate.BOUNDS). What a set cannot
identify is taken from the entry that can (``borrow``): the 2021 SC21 runs overlapped nothing, and
the FSDP runs exercise the links only through ZeRO-3's hidden all-gathers, so NCCL's link
efficiencies come from the Megatron entry of the same hardware. The per-row tables printed at the
end are the ones tests/unit/test_calibration.py asserts on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.calibrate import error_summary, error_table, fit, row_errors
from orchestrator.calibrate.rows import resolved_with, predicted_peak_gib
from orchestrator.calibrate.published import HARDWARE, all_published_rows, published_errors
from orchestrator.costmodel.calibration import FIELDS
from orchestrator.costmodel.evaluate import runtime_engine

OUT = ROOT / "orchestrator" / "costmodel" / "calibration.yaml"

# Entries in fitting order; `borrow` names the entry whose values fill what this one does not fit.
ENTRIES = [
    {"engine": "megatron", "hardware": "h100-sxm5-ndr", "free": ("gemm", "attention", "hbm", "intra_node_comm",
                                                                   "inter_node_comm", "dp_overlap", "tp_overlap")},
    # SC21 ran without FlashAttention: its efficiency is not identifiable there. FlashAttention-2
    # reaches 50-73% of A100 peak (Dao 2023, abstract).
    {"engine": "megatron", "hardware": "a100-sxm4-hdr", "free": ("gemm", "hbm", "intra_node_comm", "inter_node_comm"),
     "fixed": {"attention": 0.6}, "borrow": "megatron/h100-sxm5-ndr"},
    {"engine": "deepspeed-zero3", "hardware": "a100-sxm4-hdr",
     "free": ("gemm", "attention", "hbm", "dp_overlap", "zero3_stall_us"), "borrow": "megatron/a100-sxm4-hdr"},
    # Five runs: attention stays Megatron's (at its floor there already).
    {"engine": "deepspeed-zero3", "hardware": "h100-sxm5-ndr",
     "free": ("gemm", "hbm", "dp_overlap", "zero3_stall_us"), "borrow": "megatron/h100-sxm5-ndr"},
]
START = {"gemm": 0.8, "attention": 0.5, "hbm": 0.8, "intra_node_comm": 0.8, "inter_node_comm": 0.8, "dp_overlap": 0.8,
         "tp_overlap": 0.5, "zero3_stall_us": 500.0, "grouped_gemm": 0.5, "ep_overlap": 0.5}

HEADER = """\
# Fitted efficiencies of dsorch's time model, per engine and hardware. Written by
#     python scripts/fit_calibration.py
# from published runs: Megatron-LM (published_runs.yaml, evaluated as calibration_sets.yaml says) for
# the megatron engine, PyTorch FSDP FULL_SHARD (published_runs_fsdp.yaml) and DeepSpeed's own ZeRO-3
# (published_runs_deepspeed.yaml) for deepspeed-zero3. `covers` and `measured_gpus` say what the
# runs used; a layout or GPU beyond them is outside the fitted domain. Do not edit by hand: change the model or the sets and re-run the script.
#
# Resolution (orchestrator/costmodel/calibration.py): a profile's own `efficiency` values win;
# then this engine's entry for the profile's gpu.name (and inter_node.kind); then an entry of the
# engine it borrows from (deepspeed below ZeRO-3 has no published runs of its own yet: it borrows
# deepspeed-zero3's, the same PyTorch kernels), which makes the prediction "outside the fitted
# domain"; then `default`. `step_time_error` is the fit's residual on the entry's own rows, and
# held out (each run predicted by a fit without it): the largest held-out error is the
# interval every prediction made with the entry carries.
"""


def held_out_table() -> str:
    """The leave-one-out errors the last fit recorded (refitting them takes minutes: run the script
    without --check)."""
    from orchestrator.costmodel.calibration import calibration_table

    lines = ["held out (each run predicted by a fit without it; the interval of a prediction is the max):"]
    for e in calibration_table()["entries"]:
        err = e["step_time_error"]
        lines.append(f"{e['id']}: {err['rows']} rows, mean |error| {100 * err['held_out_mean']:.2f}%, "
                     f"max |error| {100 * err['held_out_max']:.2f}%")
    return "\n".join(lines)


def entry_id(e: dict) -> str:
    return f"{e['engine']}/{e['hardware']}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="print the per-engine error tables of the shipped calibration")
    ap.add_argument("--iters", type=int, default=300)
    args = ap.parse_args()
    if args.check:
        print(error_table(published_errors()))
        print(held_out_table())
        return

    rows = all_published_rows()
    fitted: dict[str, dict] = {}
    for spec in ENTRIES:
        eid = entry_id(spec)
        mine = [r for r in rows if r.hardware == eid]
        start = dict(START)
        if spec.get("borrow"):
            start.update(fitted[spec["borrow"]]["values"])
        start.update(spec.get("fixed", {}))
        res = fit(mine, start, tuple(spec["free"]), iters=args.iters, restarts=3)
        summary = error_summary(res.errors)
        # Leave-one-out: refit without each run and predict it. A handful of runs fits its own rows
        # closely; the held-out errors say how the entry predicts a run it has not seen, and their
        # largest is the interval every prediction with the entry carries.
        held_out = []
        for i in range(len(mine)):
            rest = mine[:i] + mine[i + 1:]
            loo = fit(rest, res.values, tuple(spec["free"]), iters=args.iters, restarts=1)
            held_out.append(row_errors([mine[i]], lambda row, v=loo.values: resolved_with(v))[0].rel_error)
        summary["loo_max"] = max(abs(e) for e in held_out)
        summary["loo_mean"] = sum(abs(e) for e in held_out) / len(held_out)
        fitted[eid] = {"values": res.values, "summary": summary, "rows": mine}
        print(f"{eid}: " + ", ".join(f"{f}={res.values[f]:.4g}" for f in FIELDS)
              + f"  mean {100 * summary['mean']:.2f}% max {100 * summary['max']:.2f}%"
              + f"  held out: mean {100 * summary['loo_mean']:.2f}% max {100 * summary['loo_max']:.2f}%", flush=True)

    entries = []
    for spec in ENTRIES:
        eid, hw = entry_id(spec), HARDWARE[spec["hardware"]]
        fz = fitted[eid]
        mine = fz["rows"]
        # The layouts the rows cover (every published row pins tp and pp): beyond them a prediction
        # is outside the fitted domain (costmodel.calibration.Resolved.beyond).
        engines = [r.engine or runtime_engine(r.runtime, r.training) for r in mine]
        covers = {"tp": max(r.pins.tp or 1 for r in mine), "pp": max(r.pins.pp or 1 for r in mine),
                  "cp": max(r.pins.cp or 1 for r in mine), "fp8": int(any(r.training.fp8 for r in mine)),
                  "tp_overlap": int(any(e.tp_overlap for e in engines)),
                  "dp_overlap": int(any(e.dp_overlap for e in engines))}
        entries.append({
            "id": eid, "engine": spec["engine"], "description": hw["description"], "gpus": hw["gpus"],
            "inter_node": hw["inter_node"], "measured_gpus": sorted({r.profile.gpu.name for r in mine}),
            "fitted": list(spec["free"]),
            **({"fixed_from_literature": spec["fixed"]} if spec.get("fixed") else {}),
            **({"borrowed_from": spec["borrow"]} if spec.get("borrow") else {}),
            "efficiency": {f: round(fz["values"][f], 4) for f in FIELDS},
            "covers": covers,
            "step_time_error": {"rows": fz["summary"]["rows"], "mean": round(fz["summary"]["mean"], 4),
                                "max": round(fz["summary"]["max"], 4),
                                "held_out_mean": round(fz["summary"]["loo_mean"], 4),
                                "held_out_max": round(fz["summary"]["loo_max"], 4)},
        })
    # Unknown hardware: the less favourable of the fitted values, and the larger of the errors.
    worse = {f: (max if f == "zero3_stall_us" else min) for f in FIELDS}
    default = {f: worse[f](e["efficiency"][f] for e in entries) for f in FIELDS}
    # Memory: the published peaks against the predicted totals. A plan within the largest
    # under-prediction of the capacity is flagged (render/console.py), since that is how far a run
    # that "fits" was seen to go beyond the model.
    peaks = []
    for r in rows:
        if r.measured_peak_gib is not None:
            predicted = predicted_peak_gib(r)
            peaks.append(predicted / r.measured_peak_gib - 1.0)
    memory = {"rows": len(peaks), "largest_under": round(max(0.0, -min(peaks)), 4),
              "largest_over": round(max(0.0, max(peaks)), 4),
              "source": "published peak memory per GPU (published_runs_fsdp.yaml measured_memory_gib)"}
    doc = {"version": 2,
           "memory_error": memory,
           "default": {"efficiency": default,
                       "step_time_error": {"mean": max(e["step_time_error"]["mean"] for e in entries),
                                           "max": max(e["step_time_error"]["max"] for e in entries)}},
           "entries": entries}
    OUT.write_text(HEADER + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=110))
    from orchestrator.costmodel.calibration import calibration_table

    calibration_table.cache_clear()
    print(f"wrote {OUT.relative_to(ROOT)}\n")
    print(error_table(published_errors()))
    print(held_out_table())


if __name__ == "__main__":
    main()
