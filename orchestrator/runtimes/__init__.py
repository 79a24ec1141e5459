"""The training runtimes dsorch plans for, one object each (``base.Runtime``): ``DEEPSPEED`` (the
bundled entrypoint on DeepSpeed) and ``MEGATRON`` (Megatron-LM's pretrain_gpt.py). Input parsers
turn a name into its object with ``runtime_named``; everything else asks the object."""

from __future__ import annotations

from orchestrator.errors import SpecError
from orchestrator.runtimes.base import Engine, Runtime
from orchestrator.runtimes.deepspeed import DEEPSPEED
from orchestrator.runtimes.megatron import MEGATRON

RUNTIMES: dict[str, Runtime] = {r.name: r for r in (DEEPSPEED, MEGATRON)}
# The names as the CLI, specs, plan.yaml and calibration records spell them, for Literal and Choice.
RUNTIME_NAMES: tuple[str, ...] = tuple(RUNTIMES)
DEFAULT = DEEPSPEED


def runtime_named(name: str | Runtime) -> Runtime:
    """The runtime of a name (an object passes through): where user input or a file is parsed."""
    if isinstance(name, Runtime):
        return name
    try:
        return RUNTIMES[name]
    except KeyError:
        raise SpecError(f"unknown runtime {name!r}: use one of {', '.join(RUNTIME_NAMES)}") from None


__all__ = ["DEEPSPEED", "DEFAULT", "MEGATRON", "RUNTIMES", "RUNTIME_NAMES", "Engine", "Runtime", "runtime_named"]
