"""The training runtimes dsorch plans for, one object each (``base.Runtime``): ``DEEPSPEED`` (the
bundled entrypoint on DeepSpeed) and ``MEGATRON`` (Megatron-LM's pretrain_gpt.py). Input parsers
turn a name into its object with ``runtime_named``; everything else asks the object.

Adding a runtime (Megatron-FSDP as its own engine, torchtitan): one module beside ``deepspeed.py``
with a ``Runtime`` subclass and its instance, listed in ``RUNTIMES`` below. It must give every field
of ``Runtime`` (its label, engine overlaps, whether the bundled trainer runs it, its calibration
engines, the files it renders and the one its program reads, how it launches, its stop handler,
its Megatron-FSDP stage if any, the features it has, how its engine's memory and communication
look to the cost model) and implement ``zero_stages``, ``zero_refusal``, ``state_bytes`` and
``dp_bucket_elements`` (``model_problems``, ``expert_zero_ok``, ``calibration_engine``,
``step_transient_bytes``, ``whole_grad_allreduce``, ``saves_fp32_master`` and ``engine_for`` where
the defaults do not hold). Beyond this package: an entry per calibration engine in
costmodel/calibration.yaml, a renderer for any file of ``renders`` that render/__init__.py's
``RENDERERS`` lacks, the checks of that file in validate/plan_dir.py, and, for a program other
than the bundled entrypoint or Megatron-LM, its node-side job in run/ (run/submission.py picks
MegatronJob where ``reads_megatron_args``) and its branches of templates/launch.sh.j2 and
job.sbatch.j2 (which branch on what the program reads, render/scripts.py ``megatron_args``)."""

from __future__ import annotations

from orchestrator.errors import SpecError
from orchestrator.runtimes.base import DS_CONFIG, MEGATRON_ARGS, Engine, Runtime
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


__all__ = [
    "DEEPSPEED",
    "DEFAULT",
    "DS_CONFIG",
    "MEGATRON",
    "MEGATRON_ARGS",
    "RUNTIMES",
    "RUNTIME_NAMES",
    "Engine",
    "Runtime",
    "runtime_named",
]
