"""A parallel layout: degrees and batch arithmetic, nothing else (cf. torchtitan's ParallelDims).

The solver produces Layouts; the renderers and the training entrypoint consume them. Legality
rules that depend on the model, the cluster or the runtime live in ``orchestrator.plan.rules``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

RECOMPUTE_LEVELS: tuple[str, ...] = ("none", "selective", "full")
RUNTIMES: tuple[str, ...] = ("deepspeed", "megatron")


# Families of layouts, named by what dominates their communication (the seed's decision guide:
# DDP, ZeRO-3/FSDP, Megatron TP, pipeline; context parallelism for long sequences), in the order a
# tie between them is reported.
FAMILIES: tuple[str, ...] = ("context-parallel", "pipeline", "zero3", "tp-heavy", "data-parallel")


def family_codes(tp, pp, zero_stage, cp):
    """Index into FAMILIES of each layout (arrays of degrees, or scalars): the first of context
    parallelism, a pipeline, ZeRO-3, tensor parallelism that the layout uses; else data parallel."""
    tp, pp, zero_stage, cp = (np.asarray(v) for v in (tp, pp, zero_stage, cp))
    return np.select([cp > 1, pp > 1, zero_stage == 3, tp > 1], [0, 1, 2, 3], default=4)


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    vpp: int
    zero_stage: int
    micro_batch_size: int
    grad_accum_steps: int
    recompute: str
    sequence_parallel: bool
    # Context parallelism (Megatron-LM --context-parallel-size): the sequence split over cp ranks,
    # ring attention between them. The global batch is not split by it.
    cp: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "vpp", "micro_batch_size", "grad_accum_steps", "cp"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        if self.recompute not in RECOMPUTE_LEVELS:
            raise ValueError(f"recompute must be one of {RECOMPUTE_LEVELS}, got {self.recompute!r}")

    @property
    def family(self) -> str:
        return FAMILIES[int(family_codes(self.tp, self.pp, self.zero_stage, self.cp))]

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.grad_accum_steps * self.dp

    def as_dict(self) -> dict:
        return asdict(self)

    def short(self) -> str:
        sp = "+sp" if self.sequence_parallel else ""
        v = f" vpp{self.vpp}" if self.vpp > 1 else ""
        c = f" cp{self.cp}" if self.cp > 1 else ""
        return (f"tp{self.tp}{sp}{c} pp{self.pp}{v} dp{self.dp} zero{self.zero_stage} "
                f"mbs{self.micro_batch_size} gas{self.grad_accum_steps} rc={self.recompute}")


def divisors(n: int) -> list[int]:
    """All positive divisors of n, ascending."""
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
        i += 1
    return small + large[::-1]
