"""The training engines as the cost model runs them: each runtime's overlap settings (``ENGINES``,
``runtime_engine``: the runtime's ``engine`` with the spec's options applied) and the optimizer
step's memory traffic. The engines' buckets are runtime facts (``Runtime.dp_bucket_elements``;
DeepSpeed's ZERO_BUCKET_ELEMENTS in orchestrator/runtimes/deepspeed.py)."""

from __future__ import annotations

from orchestrator.runtimes import RUNTIMES, Engine, runtime_named
from orchestrator.spec.training import TrainingSpec

# The engines' overlap settings are each runtime's ``engine`` (orchestrator.runtimes); calibration
# rows pass the settings of the published run.
ENGINES = {name: rt.engine for name, rt in RUNTIMES.items()}


def runtime_engine(runtime, training: TrainingSpec) -> Engine:
    """The runtime's engine with the spec's options applied (``Runtime.engine_for``)."""
    return runtime_named(runtime).engine_for(training)


# Adam step per parameter: read fp32 master, momentum, variance, fp32 gradient (16 B), write the
# first three (12 B) and the 16-bit weight copy (2 B); plus the gradient norm and unscale reads.
OPTIMIZER_BYTES_PER_PARAM = 34.0
