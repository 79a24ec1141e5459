"""What the calibration data measured, run by run (orchestrator/costmodel/published_mfu.yaml, written
from orchestrator/calibrate/__init__.py measured_runs): the file is current, each run's MFU is the
plan's MFU formula at its measured step time, and the best per hardware and precision (issue 37,
"Plausibility": a prediction above it is flagged in the plan's notes, tests/unit/test_notes.py)."""

from __future__ import annotations

from importlib import resources

import numpy as np
import pytest
import yaml

from orchestrator.calibrate import measured_mfu, measured_runs
from orchestrator.calibrate.published import all_published_rows
from orchestrator.calibrate.rows import prepare_row
from orchestrator.costmodel import evaluate
from orchestrator.costmodel.calibration import RUNS_FILE, best_measured_mfu, published_runs


def test_published_mfu_file_is_current():
    """scripts/fit_calibration.py --runs writes it; a change to the published runs or to the FLOP count
    shows here."""
    text = resources.files("orchestrator.costmodel").joinpath(RUNS_FILE).read_text(encoding="utf-8")
    assert yaml.safe_load(text)["runs"] == measured_runs()


def test_measured_mfu_is_the_plans_mfu_at_the_measured_step_time():
    """One formula: the cost model's MFU (costmodel/evaluate.py) at the measured step time."""
    rows = [r for r in all_published_rows() if r.id.startswith(("mb2511-gb200", "megatron_core_h100_weak_scaling_7"))]
    assert rows
    for row in rows:
        p = prepare_row(row)
        ev = evaluate(row.model, row.training, row.profile, row.runtime, p.cand, engine=row.engine)
        i = int(np.argmin(ev.time.step))
        assert measured_mfu(row) == pytest.approx(float(ev.mfu[i] * ev.time.step[i]) / row.measured_step_s)


def test_best_measured_mfu_per_hardware_and_precision():
    runs = published_runs()
    gb200 = best_measured_mfu("GB200", "bf16")
    assert gb200 is not None and gb200.id == "mb2511-gb200-qwen3-235b-a22b-bf16-256g-tp1pp8vp3ep32-mbs1"
    assert gb200.mfu == runs[gb200.id].mfu == pytest.approx(0.3289)
    fp8 = best_measured_mfu("GB200", "bf16", fp8=True)
    assert fp8 is not None and fp8.precision == "fp8" and fp8.gpu == "GB200"
    # H200 is H100's hardware (calibration.yaml gpus): the best H100 run, whichever name it was logged under.
    h100 = [r for r in runs.values() if r.gpu in ("H100", "H100-SXM5-80GB") and r.precision == "bf16"]
    assert best_measured_mfu("H200-SXM-141GB", "bf16") == max(h100, key=lambda r: r.mfu)
    # BF16 and FP16 are one tensor-core rate: SC21's FP16 runs count with the BF16 ones on A100.
    assert best_measured_mfu("A100-SXM4-80GB", "fp16") == best_measured_mfu("A100-SXM4-80GB", "bf16")
    assert best_measured_mfu("MI300X", "bf16") is None
