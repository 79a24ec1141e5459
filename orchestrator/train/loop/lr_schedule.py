"""The learning-rate schedule of both runtimes: Megatron-LM's formula, in one place.

Megatron-LM (megatron/core/optimizer_param_scheduler.py OptimizerParamScheduler.get_lr @ d98e8a6)
sets the rate of an iteration from the samples consumed before it: the scheduler is built at
num_steps 0 and stepped by one global batch after every successful optimizer step
(megatron/training/training.py train_step). So, in steps, step ``k`` (1-based) runs at
``lr_at(k - 1)``: with --lr-warmup-init 0 (its default) step 1 runs at 0 and step 2 at
lr / warmup. Megatron counts in samples (iterations x global batch); so does ``lr_at``, which
makes its rates the same floats as Megatron's, not merely the same numbers (lr * 3 / 5 and
lr * 144 / 240 round differently).

    warmup      done <= W (W > 0):   lr * done / W
    constant                        lr
    past the decay length D:        min_lr
    linear                          min_lr + (lr - min_lr) * (1 - r),  r = (done - W) / (D - W)
    cosine                          min_lr + (lr - min_lr) * (1 + cos(pi r)) / 2
    WSD (anneal length A)           1 until done <= D - A, then the --lr-wsd-decay-style of
                                    s = (done - (D - A)) / A: linear 1 - s, cosine (1 + cos(pi s)) / 2,
                                    exponential 2 * 0.5**s - 1, minus_sqrt 1 - sqrt(s)

The bundled entrypoint drives the optimizer's rate with ``MegatronLR`` (DeepSpeed's own
WarmupCosineLR differs: it starts its linear warmup one step late, so steps 1 and 2 both ran at
0, and its cosine counts from W - 1; deepspeed/runtime/lr_schedules.py), and megatron_args.txt
gives Megatron-LM the same schedule as flags (render/megatron.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class Schedule:
    """One run's schedule: ``decay_steps`` is the length it decays over (the plan's steps, or
    longer when the entrypoint's --extend-schedule says so); None for a constant rate."""

    lr: float
    min_lr: float
    global_batch_size: int  # the samples of a step, Megatron's unit of counting
    warmup_steps: int
    style: str  # cosine | linear | WSD | constant (Megatron-LM's --lr-decay-style)
    decay_steps: int | None
    wsd_decay_steps: int | None = None
    wsd_style: str = "exponential"

    @classmethod
    def of(cls, training, decay_steps: int | None = None) -> Schedule:
        """The schedule of a TrainingSpec, decaying over its planned steps unless told otherwise."""
        opt = training.optimizer
        return cls(
            lr=opt.lr,
            min_lr=opt.min_lr,
            global_batch_size=training.global_batch_size,
            warmup_steps=opt.warmup_steps,
            style=training.lr_decay_style,
            decay_steps=decay_steps if decay_steps is not None else training.train_steps,
            wsd_decay_steps=opt.wsd_decay_steps,
            wsd_style=opt.wsd_decay_style,
        )

    def lr_at(self, done: int) -> float:
        """The rate of the step that follows ``done`` completed steps (Megatron-LM's get_lr, in
        samples: init_lr 0 + (lr - 0) * samples / warmup samples, and so on)."""
        g = self.global_batch_size
        n, w = done * g, self.warmup_steps * g
        if w > 0 and n <= w:
            return 0.0 + (self.lr - 0.0) * float(n) / float(w)
        if self.style == "constant" or self.decay_steps is None:
            return self.lr
        d = self.decay_steps * g
        if n > d:
            return self.min_lr
        ratio = float(n - w) / float(d - w)
        if self.style == "linear":
            coeff = 1.0 - ratio
        elif self.style == "cosine":
            coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        else:  # WSD: the spec's validator requires wsd_decay_steps with it
            coeff = self._wsd(n, d)
        return self.min_lr + coeff * (self.lr - self.min_lr)

    def _wsd(self, n: int, d: int) -> float:
        """Megatron-LM's WSD coefficient after ``n`` samples of a ``d``-sample decay."""
        a = (self.wsd_decay_steps or 0) * self.global_batch_size
        start = d - a
        if n <= start:
            return 1.0
        s = float(n - start) / float(a)
        return {
            "linear": lambda: 1.0 - s,
            "cosine": lambda: 0.5 * (math.cos(math.pi * s) + 1.0),
            "exponential": lambda: 2.0 * math.pow(0.5, s) - 1.0,
            "minus_sqrt": lambda: 1.0 - math.sqrt(s),
        }[self.wsd_style]()

    def describe(self) -> str:
        head = f"warmup {self.warmup_steps} steps to {self.lr:g}, then "
        if self.style == "constant" or self.decay_steps is None:
            return head + "constant"
        tail = f" decay to {self.min_lr:g} at step {self.decay_steps}"
        if self.style == "WSD":
            return head + f"stable, {self.wsd_style} anneal over the last {self.wsd_decay_steps} steps," + tail
        return head + self.style + tail


# Steps the bundled entrypoint trains when neither --steps nor the plan (training.steps, or
# train_tokens) gives a length: enough for a first run to show its step times.
DEFAULT_STEPS = 20


def steps_to_train(training, steps: int | None) -> int:
    """The step a run trains to: ``steps`` (--steps) when given, else the plan's length, else
    ``DEFAULT_STEPS`` (the entrypoint, train/loop/entry.py; `dsorch submit --wait`'s progress bar)."""
    return steps if steps is not None else training.train_steps or DEFAULT_STEPS


def steps_past_plan(training, plan_path, steps: int | None, extend: bool) -> str | None:
    """Why ``--steps`` cannot run without --extend-schedule (None when it can): the schedule covers
    exactly the planned steps, and past them the rate would sit at min_lr without a word."""
    planned = training.train_steps
    if planned is None or steps is None or steps <= planned or extend:
        return None
    return (
        f"--steps {steps} is past the {planned} steps {plan_path} was planned for: its learning-rate "
        f"schedule ({Schedule.of(training).describe()}) ends there, and the steps after it would run "
        f"at min_lr. Re-plan with training.steps {steps} (or the train_tokens for it), train --steps "
        f"{planned} or fewer, or add --extend-schedule to stretch the decay to step {steps} (the log says so)"
    )


class MegatronLR:
    """The optimizer's rate from ``Schedule``, as DeepSpeed drives a client scheduler: built
    before the first step, ``step()`` after every applied optimizer step (engine.py
    _take_model_step; skipped on an fp16 overflow, as Megatron-LM skips it)."""

    def __init__(self, optimizer, schedule: Schedule, done: int = 0):
        self.optimizer, self.schedule = optimizer, schedule
        self.set_done(done)

    def set_done(self, done: int) -> None:
        self.done = done
        rate = self.schedule.lr_at(done)
        for group in self.optimizer.param_groups:
            group["lr"] = rate

    def step(self, *_args, **_kwargs) -> None:
        self.set_done(self.done + 1)

    def get_last_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    # DeepSpeed saves and loads a client scheduler's state with the checkpoint. The step number
    # the entrypoint resumes from is what counts (Trainer sets it), so a checkpoint written
    # under DeepSpeed's WarmupCosineLR ({"last_batch_iteration": n}) resumes too.
    def state_dict(self) -> dict:
        return {"done": self.done}

    def load_state_dict(self, state: dict) -> None:
        if "done" in state:
            self.set_done(int(state["done"]))
