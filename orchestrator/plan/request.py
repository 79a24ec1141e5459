"""One planning request: the inputs ``plan.make.make_plan`` turns into a ``Plan``.

`dsorch plan` (cli/planning.py) builds it from a SPEC and the flags, ``compose.replan`` from what a
plan directory's plan.yaml recorded, `dsorch trial` and `dsorch replan` (run/trial.py, run/replan.py)
from their own choices; each then hands the same object to ``compose.plan_files`` and ``make_plan``.

Light on purpose (the other types only for annotations): the CLI reads ``KEEP`` and ``TRIAL_STEPS``
for its defaults when the commands are defined, and `dsorch --help` should not load the cost model
for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.plan.layout import Pins

if TYPE_CHECKING:
    from orchestrator.plan.layout import Layout
    from orchestrator.runtimes import Runtime
    from orchestrator.spec.cluster import LoadedProfile
    from orchestrator.spec.model import SpecFile

# Layouts a plan lists: the chosen one and 7 alternatives, unless `dsorch plan --top N` asks for more
# (plan.yaml and plan.md list them; the search keeps as many).
KEEP = 8
# Steps of each layout `dsorch trial` runs by default (cli/trial.py --steps): also what plan.yaml's
# notes price for measuring a plan (render/notes.py).
TRIAL_STEPS = 20


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanRequest:
    """What to plan: a loaded model spec and cluster profile, the runtime, and what the user fixed."""

    spec: SpecFile
    spec_path: str  # as the generated files name it: relative to the plan directory, never absolute
    spec_sha256: str
    profile: LoadedProfile  # as loaded: ``nodes`` and ``gpus_per_node`` are applied by make_plan
    runtime: Runtime | str  # the object or its name (runtimes.runtime_named)
    pins: Pins = Pins()
    nodes: int | None = None  # --nodes, as given; None: the profile's node count
    gpus_per_node: int | None = None  # --gpus-per-node, as given; None: the profile's
    memory_margin_gib: float | None = None  # None: the default margin (calibration.default_memory_margin)
    keep: int = KEEP  # layouts kept (--top)
    shown_path: str | None = None  # the spec as the user gave it, for errors; None: spec_path
    # `dsorch trial`: layouts whose fit was measured, overruling the memory model (solver.search).
    measured_fit: dict[Layout, bool] | None = None

    @property
    def shown(self) -> str:
        """The spec as error messages name it."""
        return self.shown_path or self.spec_path
