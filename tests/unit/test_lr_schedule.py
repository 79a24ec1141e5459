"""The learning-rate schedule (train/loop/lr_schedule.py) against Megatron-LM's OptimizerParamScheduler.

``megatron_lr`` below is Megatron-LM's get_lr written out from its source
(megatron/core/optimizer_param_scheduler.py @ d98e8a6), counted in samples as Megatron counts
them (training.py get_optimizer_param_scheduler: steps x global batch), and driven as its
training loop drives it: built at 0, stepped by one global batch after each optimizer step.
Where the Megatron-LM mirror is on this machine, the real class is run too.
"""

from __future__ import annotations

import math
import os
import sys
import types
from pathlib import Path

import pytest
import torch

from orchestrator.errors import SpecError
from orchestrator.spec.training import OptimizerSpec, TrainingSpec
from orchestrator.train.loop.lr_schedule import MegatronLR, Schedule

GBS = 48  # samples per step: Megatron's counts are in samples; the ratios must not care
# A Megatron-LM checkout, as tests/system/test_megatron_lm.py takes it.
MEGATRON = os.environ.get("MEGATRON_LM")


def megatron_lr(num_samples, *, lr, min_lr, warmup, decay, style, wsd=None, wsd_style="exponential", init=0.0):
    """OptimizerParamScheduler.get_lr, transcribed; all lengths in samples."""
    if warmup > 0 and num_samples <= warmup:
        return init + (lr - init) * float(num_samples) / float(warmup)
    if style == "constant":
        return lr
    if num_samples > decay:
        return min_lr
    ratio = float(num_samples - warmup) / float(decay - warmup)
    if style == "linear":
        coeff = 1.0 - ratio
    elif style == "cosine":
        coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
    else:
        start = decay - wsd
        if num_samples <= start:
            coeff = 1.0
        else:
            s = float(num_samples - start) / float(wsd)
            coeff = {
                "linear": 1.0 - s,
                "cosine": 0.5 * (math.cos(math.pi * s) + 1.0),
                "exponential": 2.0 * math.pow(0.5, s) - 1.0,
                "minus_sqrt": 1.0 - math.sqrt(s),
            }[wsd_style]
    return min_lr + coeff * (lr - min_lr)


CASES = [
    dict(style="cosine", warmup=5, steps=30),
    dict(style="linear", warmup=7, steps=40),
    dict(style="constant", warmup=3, steps=None),
    dict(style="cosine", warmup=0, steps=12),
    *[
        dict(style="WSD", warmup=4, steps=50, wsd=10, wsd_style=s)
        for s in ("exponential", "linear", "cosine", "minus_sqrt")
    ],
]


def _training(case) -> TrainingSpec:
    opt = OptimizerSpec(
        lr=3e-3,
        min_lr=3e-4,
        warmup_steps=case["warmup"],
        decay_style=case["style"],
        wsd_decay_steps=case.get("wsd"),
        wsd_decay_style=case.get("wsd_style", "exponential"),
    )
    return TrainingSpec(seq_length=64, global_batch_size=GBS, steps=case["steps"], optimizer=opt)


def _ids(case):
    return "-".join(str(v) for v in case.values() if v is not None)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_rate_of_every_step_is_megatrons(case):
    """The rate each optimizer step runs at, past the end too, through DeepSpeed's protocol."""
    t = _training(case)
    steps = case["steps"] or 20
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([param], lr=123.0)
    sched = MegatronLR(opt, Schedule.of(t))
    consumed = 0  # Megatron's num_steps: built at 0 (__init__ calls step(0))
    for _ in range(steps + 3):
        want = megatron_lr(
            consumed,
            lr=3e-3,
            min_lr=3e-4,
            warmup=case["warmup"] * GBS,
            decay=(case["steps"] or 1) * GBS,
            style=case["style"],
            wsd=(case.get("wsd") or 0) * GBS,
            wsd_style=case.get("wsd_style", "exponential"),
        )
        assert opt.param_groups[0]["lr"] == want  # the same floats, not nearly
        sched.step()  # DeepSpeed, after the optimizer step
        consumed += GBS  # Megatron's train_step: opt_param_scheduler.step(increment=global batch)


def test_first_steps_warm_up_from_zero_like_megatron():
    """Step 1 at Megatron's --lr-warmup-init 0, step 2 at lr / warmup (DeepSpeed's WarmupCosineLR
    ran steps 1 and 2 both at 0)."""
    s = Schedule.of(_training(CASES[0]))
    assert [s.lr_at(k - 1) for k in (1, 2, 3)] == [0.0, 3e-3 / 5, 2 * 3e-3 / 5]
    assert s.lr_at(5) == 3e-3 and s.lr_at(30) == pytest.approx(3e-4) and s.lr_at(31) == 3e-4


def test_resume_sets_the_rate_of_the_step_resumed_from():
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([param], lr=1.0)
    s = Schedule.of(_training(CASES[1]))
    sched = MegatronLR(opt, s)
    sched.load_state_dict({"last_batch_iteration": 9})  # a checkpoint of DeepSpeed's WarmupCosineLR
    assert sched.done == 0
    sched.set_done(10)
    assert opt.param_groups[0]["lr"] == s.lr_at(10)
    fresh = MegatronLR(torch.optim.AdamW([param], lr=1.0), s)
    fresh.load_state_dict(sched.state_dict())
    assert fresh.get_last_lr() == [s.lr_at(10)]


@pytest.mark.skipif(not MEGATRON, reason="MEGATRON_LM is not set: point it at a Megatron-LM checkout")
@pytest.mark.parametrize("case", [c for c in CASES if c["steps"]], ids=_ids)
def test_megatrons_own_class_where_its_source_is_here(case, monkeypatch):
    """Megatron-LM's own OptimizerParamScheduler, run from the checkout's source (its logging
    helper stubbed: megatron.core.utils pulls in the whole package)."""
    src = (Path(str(MEGATRON)) / "megatron" / "core" / "optimizer_param_scheduler.py").read_text()
    for name in ("megatron", "megatron.core"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    utils = types.ModuleType("megatron.core.utils")
    utils.log_single_rank = lambda *a, **k: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "megatron.core.utils", utils)
    ns: dict = {"__name__": "megatron_optimizer_param_scheduler"}
    exec(compile(src, "optimizer_param_scheduler.py", "exec"), ns)
    opt = types.SimpleNamespace(param_groups=[{}])
    steps = case["steps"]
    theirs = ns["OptimizerParamScheduler"](
        opt,
        init_lr=0.0,
        max_lr=3e-3,
        min_lr=3e-4,
        lr_warmup_steps=case["warmup"] * GBS,
        lr_decay_steps=steps * GBS,
        lr_decay_style=case["style"],
        start_wd=0.1,
        end_wd=0.1,
        wd_incr_steps=steps * GBS,
        wd_incr_style="constant",
        wsd_decay_steps=(case.get("wsd") or 0) * GBS or None,
        lr_wsd_decay_style=case.get("wsd_style"),
    )
    ours = Schedule.of(_training(case))
    for done in range(steps + 3):
        assert opt.param_groups[0]["lr"] == ours.lr_at(done), done
        theirs.step(GBS)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(steps=None, optimizer=OptimizerSpec(warmup_steps=2, decay_style="linear")), "decays over the training"),
        (dict(optimizer=OptimizerSpec(warmup_steps=2, decay_style="WSD")), "needs optimizer.wsd_decay_steps"),
        (dict(optimizer=OptimizerSpec(warmup_steps=2, wsd_decay_steps=5)), "applies to decay_style WSD"),
        (
            dict(optimizer=OptimizerSpec(warmup_steps=4, decay_style="WSD", wsd_decay_steps=17)),
            "make it at most 16",
        ),
    ],
)
def test_schedule_errors_name_the_fix(changes, message):
    with pytest.raises(ValueError, match=message):
        TrainingSpec(**{"seq_length": 64, "global_batch_size": 8, "steps": 20, **changes})


def test_default_style_is_cosine_with_a_length_constant_without():
    assert (
        TrainingSpec(
            seq_length=8, global_batch_size=8, steps=30, optimizer=OptimizerSpec(warmup_steps=1)
        ).lr_decay_style
        == "cosine"
    )
    assert TrainingSpec(seq_length=8, global_batch_size=8).lr_decay_style == "constant"


def test_steps_past_the_plan_are_refused_in_one_paragraph():
    from orchestrator.train.loop.entry import check_steps, run_schedule

    training = _training(CASES[0])
    plan = types.SimpleNamespace(spec=types.SimpleNamespace(training=training), path=Path("plans/tiny"))
    args = types.SimpleNamespace(steps=31, extend_schedule=False)
    with pytest.raises(
        SpecError, match=r"--steps 31 is past the 30 steps plans/tiny was planned for.*--extend-schedule"
    ):
        check_steps(plan, args)
    check_steps(plan, types.SimpleNamespace(steps=30, extend_schedule=False))
    args.extend_schedule = True
    check_steps(plan, args)
    schedule, text = run_schedule(training, args)
    assert schedule.decay_steps == 31 and "extended by --extend-schedule from the plan's 30 steps" in text
    assert schedule.lr_at(30) > schedule.lr_at(31) == pytest.approx(3e-4)
