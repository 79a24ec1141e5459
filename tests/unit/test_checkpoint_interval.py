"""How often a plan checkpoints: Young/Daly's interval from the chosen layout's step time, the
checkpoint's write time and the job's MTBF, capped by the allocation; a spec's own interval kept
with a warning when far off; and the interval the scripts pass being the one the plan prints."""

from __future__ import annotations

import dataclasses
import math

import pytest

from orchestrator.costmodel.checkpoint import FAR_FACTOR, checkpoint_bytes, choose_interval, young_daly_s
from orchestrator.plan.layout import Pins
from orchestrator.plan.make import allocation_seconds, make_plan, plan_checkpoint
from orchestrator.plan.request import PlanRequest
from orchestrator.render.megatron import megatron_flags
from orchestrator.render.notes import notes_doc, notes_text
from orchestrator.render.scripts import render_sbatch
from orchestrator.spec.cluster import load_profile
from orchestrator.spec.model import load_spec
from orchestrator.spec.sbatch import parse_slurm_time

from ..conftest import EXAMPLES, PROFILES

SIZE = 5.7e12  # bytes: any size; the expectations below are computed from it
GBPS = 5.0
MTBF = 156.0 * 3600.0


def _expected_steps(step_s: float, size: float = SIZE, gbps: float = GBPS, mtbf: float = MTBF) -> int:
    """The formula, written out: sqrt(2 x write x MTBF) over the step time, rounded, at least one."""
    return max(1, round(math.sqrt(2.0 * (size / (gbps * 1e9)) * mtbf) / step_s))


@pytest.mark.parametrize("step_s", [0.5, 12.0, 339.0, 2000.0])
def test_interval_is_young_daly_in_whole_steps(step_s):
    ck = choose_interval(step_s, SIZE, GBPS, MTBF, None)
    assert ck.steps == ck.optimum_steps == _expected_steps(step_s)
    assert ck.write_s == pytest.approx(SIZE / (GBPS * 1e9))
    assert ck.lost_s == pytest.approx(ck.steps * step_s / 2 + ck.write_s)
    assert not ck.given and not ck.capped and ck.warnings() == []


def test_a_slower_step_gives_fewer_steps_and_a_larger_mtbf_a_longer_interval():
    fast, slow = choose_interval(100.0, SIZE, GBPS, MTBF, None), choose_interval(400.0, SIZE, GBPS, MTBF, None)
    assert slow.steps < fast.steps
    # The interval in seconds stays Young/Daly's whichever the step time (up to one step's rounding).
    for ck in (fast, slow):
        assert abs(ck.interval_s - young_daly_s(ck.write_s, MTBF)) <= ck.step_s / 2
    reliable = choose_interval(100.0, SIZE, GBPS, 4 * MTBF, None)
    assert reliable.interval_s > fast.interval_s and reliable.steps == _expected_steps(100.0, mtbf=4 * MTBF)
    # A faster file system writes sooner, so checkpoints come more often.
    assert choose_interval(100.0, SIZE, 4 * GBPS, MTBF, None).steps < fast.steps


def test_the_time_limit_caps_the_interval_so_one_checkpoint_lands_in_each_allocation():
    step_s, limit_s = 339.0, 4 * 3600.0 - 90
    free = choose_interval(step_s, SIZE, GBPS, MTBF, None)
    ck = choose_interval(step_s, SIZE, GBPS, MTBF, limit_s)
    assert free.interval_s + free.write_s > limit_s  # the case is one the cap changes
    assert ck.steps == math.floor((limit_s - ck.write_s) / step_s) and ck.capped
    assert ck.steps * step_s + ck.write_s <= limit_s < (ck.steps + 1) * step_s + ck.write_s
    # A limit longer than the optimum leaves it alone.
    long = choose_interval(step_s, SIZE, GBPS, MTBF, free.interval_s + free.write_s + step_s)
    assert long.steps == free.steps and not long.capped


def test_a_step_and_a_write_longer_than_the_allocation_is_one_step_and_a_warning():
    ck = choose_interval(3000.0, SIZE, GBPS, MTBF, 1800.0)
    assert ck.steps == 1 and any("raise slurm.time" in w for w in ck.warnings())


def test_a_given_interval_stays_and_is_warned_about_when_far_off():
    best = _expected_steps(100.0)
    near = choose_interval(100.0, SIZE, GBPS, MTBF, None, given=best * 2)
    assert near.steps == best * 2 and near.given and near.warnings() == []
    far = choose_interval(100.0, SIZE, GBPS, MTBF, None, given=math.ceil(best * FAR_FACTOR) + 1)
    assert far.steps == math.ceil(best * FAR_FACTOR) + 1 and "training.checkpoint.interval" in far.warnings()[0]
    assert choose_interval(100.0, SIZE, GBPS, MTBF, None, given=max(1, best // 4)).warnings()
    limit = 3600.0
    long = choose_interval(100.0, SIZE, GBPS, MTBF, limit, given=int(limit // 100) + 1)
    assert any("outlasts an allocation" in w for w in long.warnings())


def test_checkpoint_size_is_weights_plus_master_plus_adam_moments():
    n = 1_000_003
    assert checkpoint_bytes(n, "megatron", "bf16", 1) == n * (2 + 4 + 8)
    assert checkpoint_bytes(n, "deepspeed", "bf16", 0) == n * (2 + 4 + 8)
    assert checkpoint_bytes(n, "megatron", "fp32", 0) == n * (4 + 8)
    # DeepSpeed's ZeRO optimizers clone an fp32 partition even for an fp32 model.
    assert checkpoint_bytes(n, "deepspeed", "fp32", 1) == n * (4 + 4 + 8)


# ---- on a plan -----------------------------------------------------------------------------------


def _plan_405b(nodes: int = 32, runtime: str = "megatron"):
    spec, _ = load_spec(EXAMPLES / "llama3-405b.yaml")
    loaded = load_profile("hgx-h200-ndr", PROFILES)
    return make_plan(
        PlanRequest(
            spec=spec, spec_path="llama3-405b.yaml", spec_sha256="0" * 64, profile=loaded, runtime=runtime, nodes=nodes
        )
    )


def test_the_405b_plan_checkpoints_well_inside_its_allocation_and_scripts_use_it():
    plan = _plan_405b()
    ck = plan.checkpoint
    p = plan.profile
    limit = parse_slurm_time(p.slurm.time) * 60 - p.slurm.signal_delay_s
    assert allocation_seconds(p) == limit
    assert ck.mtbf_s == pytest.approx(p.reliability.node_mtbf_hours * 3600 / p.nodes)
    m, t = plan.spec.model, plan.spec.training
    expect = checkpoint_bytes(m.num_params + m.mtp_params, "megatron", t.precision, plan.layout.zero_stage)
    assert ck.size_bytes == expect
    assert ck.steps == min(
        _expected_steps(plan.chosen.step_time_s, expect, p.filesystem.write_gbps, ck.mtbf_s), ck.cap_steps
    )
    assert ck.interval_s + ck.write_s < limit / 2  # well under the allocation, not just under it
    # The profile: 24-hour allocations. The interval is the same and still well inside one.
    day = p.model_copy(update={"slurm": p.slurm.model_copy(update={"time": "24:00:00"})})
    assert plan_checkpoint(plan.spec, day, plan.runtime, plan.chosen).steps == ck.steps
    assert ck.interval_s + ck.write_s < 12 * 3600
    assert dict(megatron_flags(plan))["--save-interval"] == str(ck.steps)
    assert f"Checkpoints are also written every {ck.steps} steps." in render_sbatch(plan)
    doc = notes_doc(plan)["checkpoint"]
    assert doc["interval_steps"] == ck.steps and doc["basis"] == "young_daly"
    assert any(n.startswith(f"checkpoint every {ck.steps} steps") for n in notes_text(plan))
    # Deterministic: the same inputs give the same interval.
    assert _plan_405b().checkpoint == ck


def test_on_a_plan_the_interval_follows_the_step_time_and_the_node_count():
    plan = _plan_405b()
    slower = dataclasses.replace(plan.chosen, step_time_s=plan.chosen.step_time_s * 3)
    a = plan.checkpoint
    b = plan_checkpoint(plan.spec, plan.profile, plan.runtime, slower)
    assert b.steps < a.steps and b.steps == _expected_steps(
        slower.step_time_s, a.size_bytes, plan.profile.filesystem.write_gbps, a.mtbf_s
    )
    fewer = plan_checkpoint(plan.spec, plan.profile.resized(8), plan.runtime, plan.chosen)
    assert fewer.mtbf_s == pytest.approx(4 * a.mtbf_s) and fewer.interval_s > a.interval_s


def test_a_spec_interval_is_kept_and_auto_is_the_default():
    plan = _plan_405b()
    assert plan.spec.training.checkpoint.interval == "auto"
    training = plan.spec.training.model_copy(
        update={"checkpoint": plan.spec.training.checkpoint.model_copy(update={"interval": 1000})}
    )
    spec = plan.spec.model_copy(update={"training": training})
    ck = plan_checkpoint(spec, plan.profile, plan.runtime, plan.chosen)
    assert ck.steps == 1000 and ck.given
    # 1,000 steps of 5 minutes is far past both the optimum and a 24 h allocation: both warnings.
    assert len(ck.warnings()) == 2


def test_a_time_limit_of_zero_is_no_limit_to_cap_by():
    profile = load_profile("local", PROFILES).profile
    assert allocation_seconds(profile) == parse_slurm_time(profile.slurm.time) * 60 - profile.slurm.signal_delay_s
    unlimited = profile.model_copy(update={"slurm": profile.slurm.model_copy(update={"time": "0"})})
    assert allocation_seconds(unlimited) is None


@pytest.mark.parametrize("bad", [0, -5, True, "often", 2.5, 1_000_000_001])
def test_a_bad_interval_is_refused_with_one_message(bad):
    from pydantic import ValidationError

    from orchestrator.spec.training import CheckpointSpec

    with pytest.raises(ValidationError, match="a number of steps from 1 to 1000000000, or auto") as e:
        CheckpointSpec(interval=bad)
    assert e.value.error_count() == 1
