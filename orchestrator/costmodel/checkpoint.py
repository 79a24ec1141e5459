"""How often to checkpoint: the interval that loses the least time to writes and failures together.

Young (1974, "A first order approximation to the optimum checkpoint interval", CACM 17(9)) and Daly
(2006, "A higher order estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3),
eq. 37's first-order term): with a checkpoint that takes ``write_s`` to write and a mean time
between failures ``mtbf_s``, the compute time between checkpoints that minimises the expected
wall time is sqrt(2 x write_s x mtbf_s) (for write_s well under the MTBF). A failure then loses on
average half an interval of work plus the write it was in (Daly 2006, Sec. 3: a failure lands
uniformly inside the interval; the restart time, which no interval changes, is left out).

Pure: numbers in, numbers out; the plan (plan/make.py) feeds it the chosen layout's step time,
the model's checkpoint size and the profile's file system, failure rate and time limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.costmodel.memory import DTYPE_BYTES
from orchestrator.runtimes import Runtime, runtime_named
from orchestrator.spec.cluster import bytes_per_s

# Bytes per parameter a checkpoint holds, summed over all ranks (each shard is written once):
# the model's weights in the training dtype, plus the optimizer's fp32 master copy and the two
# AdamW moments. DeepSpeed writes the module weights once per model-parallel group (engine.py
# _configure_checkpointing: save_non_zero_checkpoint on the data-parallel writer) and every rank's
# optimizer partition (bf16_optimizer.py / zero/stage_1_and_2.py state_dict:
# SINGLE_PARTITION_OF_FP32_GROUPS beside BASE_OPTIMIZER_STATE); Megatron-LM's distributed optimizer
# saves the same fp32 main params and moments, sharded. Gradients and activations are not saved.
ADAM_MOMENTS_BYTES = 8
FP32_MASTER_BYTES = 4

# A user's interval this many times off the optimum (either way) gets a note.
FAR_FACTOR = 3.0


def checkpoint_bytes(params: int, runtime: str | Runtime, precision: str, zero_stage: int) -> float:
    """The size of one checkpoint, all ranks together. fp32 training keeps no separate master copy,
    except where the runtime's optimizer keeps one of its own (``Runtime.saves_fp32_master``:
    DeepSpeed's ZeRO optimizers)."""
    master = FP32_MASTER_BYTES if runtime_named(runtime).saves_fp32_master(precision, zero_stage) else 0
    return float(params) * (DTYPE_BYTES[precision] + master + ADAM_MOMENTS_BYTES)


def young_daly_s(write_s: float, mtbf_s: float) -> float:
    """Daly 2006's first-order optimum (Young 1974): sqrt(2 x write time x MTBF), in seconds."""
    return math.sqrt(2.0 * write_s * mtbf_s)


@dataclass(frozen=True)
class CheckpointInterval:
    """The interval a plan checkpoints at and what it rests on (all times in seconds)."""

    steps: int  # what the scripts pass as --save-interval
    optimum_steps: int  # Young/Daly's, before the time-limit cap
    cap_steps: int | None  # the most that still lets one checkpoint finish inside an allocation
    given: bool  # training.checkpoint.interval was set in the spec
    step_s: float
    size_bytes: float
    write_s: float
    mtbf_s: float  # the job's: node MTBF / nodes
    limit_s: float | None  # the allocation's usable time (time limit less the signal's lead)

    @property
    def interval_s(self) -> float:
        return self.steps * self.step_s

    @property
    def lost_s(self) -> float:
        """Expected work lost per failure: half an interval plus the write (Daly 2006's approximation)."""
        return self.interval_s / 2.0 + self.write_s

    @property
    def capped(self) -> bool:
        return not self.given and self.cap_steps is not None and self.steps < self.optimum_steps

    def warnings(self) -> list[str]:
        """What is wrong with the interval, as sentences (no trailing period)."""
        out = []
        if self.limit_s is not None and self.step_s + self.write_s > self.limit_s:
            out.append(
                f"one step ({self.step_s:.3g} s) and one checkpoint write ({self.write_s:.3g} s) take longer than "
                f"the {self.limit_s / 3600:.3g} h an allocation has before its signal: raise slurm.time"
            )
        if not self.given:
            return out
        best = min(self.optimum_steps, self.cap_steps or self.optimum_steps)
        ratio = self.steps / best
        if ratio > FAR_FACTOR or ratio < 1.0 / FAR_FACTOR:
            out.append(
                f"training.checkpoint.interval {self.steps} is {ratio:.3g}x the {best} steps this plan would "
                f"choose (Young/Daly, capped by the time limit): set it to auto unless you mean it"
            )
        if self.limit_s is not None and self.interval_s + self.write_s > self.limit_s:
            out.append(
                f"training.checkpoint.interval {self.steps} steps ({self.interval_s / 3600:.3g} h) outlasts an "
                f"allocation ({self.limit_s / 3600:.3g} h before the signal): a failure with no signal loses "
                f"the whole allocation"
            )
        return out


def choose_interval(
    step_s: float,
    size_bytes: float,
    write_gbps: float,
    mtbf_s: float,
    limit_s: float | None,
    given: int | None = None,
) -> CheckpointInterval:
    """Young/Daly's interval in whole steps (at least one), capped so that a checkpoint started after
    that many steps is written before the allocation's signal; ``given``: the spec's own interval,
    kept as set (``warnings`` says when it is far off)."""
    write_s = size_bytes / bytes_per_s(write_gbps)
    optimum = max(1, round(young_daly_s(write_s, mtbf_s) / step_s))
    cap = None if limit_s is None else max(1, math.floor((limit_s - write_s) / step_s))
    steps = given if given is not None else min(optimum, cap or optimum)
    return CheckpointInterval(
        steps=steps,
        optimum_steps=optimum,
        cap_steps=cap,
        given=given is not None,
        step_s=step_s,
        size_bytes=size_bytes,
        write_s=write_s,
        mtbf_s=mtbf_s,
        limit_s=limit_s,
    )
