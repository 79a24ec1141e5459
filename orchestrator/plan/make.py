"""From inputs to a chosen layout: the one object every renderer reads.

``make_plan`` is pure given its inputs (specs already loaded); the CLI does the loading and the
writing around it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator import __version__
from orchestrator.costmodel.calibration import default_memory_margin
from orchestrator.costmodel.checkpoint import CheckpointInterval, checkpoint_bytes, choose_interval
from orchestrator.errors import LayoutError, NoFeasibleLayout
from orchestrator.plan.decisions import Decisions, decide
from orchestrator.plan.layout import Layout, Pins
from orchestrator.plan.request import KEEP, PlanRequest
from orchestrator.plan.rules import check_model, check_training
from orchestrator.plan.solver import NODE_SCAN_FACTOR, Scored, SearchResult, explain_pins, minimum_nodes, search
from orchestrator.runtimes import Runtime, runtime_named
from orchestrator.spec.cluster import ClusterProfile, check_local_nodes
from orchestrator.spec.model import SpecFile
from orchestrator.spec.sbatch import parse_slurm_time


@dataclass(frozen=True)
class Plan:
    spec: SpecFile
    spec_path: str  # as shown in generated files: relative, never absolute
    spec_sha256: str
    profile: ClusterProfile  # with --nodes applied
    profile_origin: str
    profile_sha256: str
    runtime: Runtime
    pins: Pins
    memory_margin_gib: float
    result: SearchResult
    chosen: Scored
    nodes_override: int | None = None  # --nodes, as given
    gpus_per_node_override: int | None = None  # --gpus-per-node, as given
    keep: int = KEEP  # layouts kept (--top): plan.yaml and plan.md list them, so the regenerate line says it
    version: str = __version__
    # Measurements behind the choice (`dsorch trial`): which trials, what they measured.
    evidence: dict | None = None
    # Where the memory margin comes from: None when --memory-margin gave it, else the default's
    # origin in words (calibration.default_memory_margin).
    memory_margin_origin: str | None = None
    # The chosen layout's efficiencies, model FLOPs and engine settings (plan.decisions.decide).
    decisions: Decisions = field(kw_only=True)

    @property
    def resize_flags(self) -> str:
        """The plan command's resizing flags, for the regenerate line in plan.yaml."""
        return (f" --nodes {self.nodes_override}" if self.nodes_override else "") + (
            f" --gpus-per-node {self.gpus_per_node_override}" if self.gpus_per_node_override else ""
        )

    @property
    def layout(self) -> Layout:
        return self.chosen.layout

    @property
    def alternatives(self) -> list[Scored]:
        return self.result.ranked[1:]

    @property
    def checkpoint(self) -> CheckpointInterval:
        """How often the run checkpoints (--save-interval), from the chosen layout's step time."""
        return plan_checkpoint(self.spec, self.profile, self.runtime, self.chosen)


def allocation_seconds(profile: ClusterProfile) -> float | None:
    """The time an allocation trains before SLURM's signal (slurm.time less signal_delay_s; the local
    executor takes the same limit, run/backends/local.py executor_for timeout_min); None for a time limit
    of 0 (sbatch(1): no limit)."""
    minutes = parse_slurm_time(profile.slurm.time)
    if minutes == 0:
        return None
    return float(minutes * 60 - profile.slurm.signal_delay_s)


def plan_checkpoint(spec: SpecFile, profile: ClusterProfile, runtime: Runtime, chosen: Scored) -> CheckpointInterval:
    """The checkpoint interval of a plan: the spec's, or Young/Daly's from the chosen layout's step
    time, the checkpoint's size over the profile's write bandwidth, and the job's MTBF (node MTBF
    over the nodes: a failure of any node stops the job)."""
    m, t = spec.model, spec.training
    size = checkpoint_bytes(m.num_params + m.mtp_params, runtime, t.precision, chosen.layout.zero_stage)
    given = t.checkpoint.interval
    return choose_interval(
        chosen.step_time_s,
        size,
        profile.filesystem.write_gbps,
        profile.reliability.node_mtbf_hours * 3600.0 / profile.nodes,
        allocation_seconds(profile),
        None if given == "auto" else given,
    )


def _nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


def _pins_text(pins: Pins) -> str:
    items = [f"{k}={v}" for k, v in pins.pinned().items()]
    return f" with {', '.join(items)} pinned" if items else ""


def make_plan(request: PlanRequest) -> Plan:
    """The plan of ``request``: the profile resized, the inputs checked, every legal layout searched
    and the fastest that fits chosen. ``request.spec_path`` goes into the generated files,
    ``request.shown`` into error messages."""
    r = request
    loaded = r.profile
    memory_margin_gib, origin = r.memory_margin_gib, None
    if memory_margin_gib is None:
        memory_margin_gib, origin = default_memory_margin(loaded.profile.gpu.memory_gib)
    if r.gpus_per_node is not None and r.gpus_per_node > loaded.profile.gpus_per_node:
        raise LayoutError(
            f"--gpus-per-node {r.gpus_per_node}: profile '{loaded.profile.name}' has "
            f"{loaded.profile.gpus_per_node} GPUs per node; --gpus-per-node plans for part of a node (a larger "
            f"count needs a profile that says so, e.g. one that extends it with gpus_per_node: {r.gpus_per_node})."
        )
    check_local_nodes(loaded.profile, r.nodes)
    if memory_margin_gib >= loaded.profile.gpu.memory_gib:
        raise LayoutError(
            f"--memory-margin {memory_margin_gib:g} GiB leaves nothing of the {loaded.profile.gpu.memory_gib:g} "
            f"GiB per GPU; use a margin below the GPU memory."
        )
    spec, runtime, pins = r.spec, runtime_named(r.runtime), r.pins
    profile = loaded.profile.resized(r.nodes, r.gpus_per_node)
    problems = check_model(spec.model, runtime) + check_training(spec.training, profile, runtime)
    if problems:
        raise LayoutError(f"{r.shown}: " + "; ".join(problems) + ".")
    result = search(
        spec.model,
        spec.training,
        profile,
        runtime,
        pins,
        memory_margin_gib=memory_margin_gib,
        keep=r.keep,
        measured_fit=r.measured_fit,
    )
    if result.evaluated == 0:
        reasons = explain_pins(spec.model, spec.training, profile, runtime, pins)
        if not reasons:
            reasons = [
                f"no layout of {profile.world_size} GPUs satisfies the pinned values and the batch arithmetic "
                f"(global_batch_size {spec.training.global_batch_size} must divide by dp x micro-batch)"
            ]
        raise LayoutError(
            f"no legal layout for {spec.name} on {profile.name} ({_nodes(profile.nodes)}){_pins_text(pins)}: "
            + "; ".join(reasons)
            + "."
        )
    if result.best is None:
        raise NoFeasibleLayout(_nothing_fits(spec, profile, runtime, pins, result, memory_margin_gib))
    return Plan(
        spec,
        r.spec_path,
        r.spec_sha256,
        profile,
        loaded.source.origin,
        loaded.sha256,
        runtime,
        pins,
        memory_margin_gib,
        result,
        result.best,
        r.nodes,
        r.gpus_per_node,
        r.keep,
        memory_margin_origin=origin,
        decisions=decide(spec, profile, runtime, result.best.layout),
    )


def _nothing_fits(
    spec: SpecFile, profile: ClusterProfile, runtime: Runtime, pins: Pins, result: SearchResult, margin: float
) -> str:
    closest = result.closest[0]
    L = closest.layout
    cap = result.capacity_gib
    lines = [
        f"{spec.name} does not fit on {_nodes(profile.nodes)} of {profile.name}{_pins_text(pins)}: "
        f"all {result.evaluated} legal layouts exceed the {cap:g} GiB per GPU. "
        f"The closest to fitting, {L.short()}, needs {closest.memory_gib['total']:.1f} GiB "
        f"({closest.over_gib:.1f} GiB more)."
    ]
    if pins.all_pinned():
        return lines[0] + " Unpin some of the layout (drop --tp/--pp/--mbs/...) or use more nodes (--nodes)."
    fsdp_zero = runtime.fsdp_zero_stage
    if fsdp_zero is not None and pins.zero_stage is None:
        # Megatron-FSDP is searched only when pinned (Runtime.fsdp_zero_stage): say so when it would fit.
        fsdp = search(
            spec.model,
            spec.training,
            profile,
            runtime,
            pins.replaced(zero_stage=fsdp_zero),
            memory_margin_gib=margin,
            keep=1,
        ).best
        if fsdp is not None:
            lines.append(
                f"With Megatron-FSDP's sharded gradients (--zero {fsdp_zero}, searched only when "
                f"pinned) {fsdp.layout.short()} fits at {fsdp.memory_gib['total']:.1f} GiB per GPU."
            )
    if profile.one_machine:  # more nodes are not to be had (spec/cluster.py check_local_nodes)
        lines.append(
            f"{profile.name} runs on this machine, one node (executor: local): plan for a SLURM cluster's "
            f"profile, or use a smaller model, a shorter seq_length or a smaller global batch."
        )
        return " ".join(lines)
    more = minimum_nodes(spec.model, spec.training, profile, runtime, pins, memory_margin_gib=margin)
    if more is not None:
        n, B = more.nodes, more.best.layout
        there = f"there {B.short()} takes {more.best.memory_gib['total']:.1f} GiB per GPU"
        if more.least:
            lines.append(f"It needs at least {_nodes(n)} of {profile.name} (rerun with --nodes {n}): {there}.")
        else:
            # The scan doubled past its first 32 counts: n fits, but a count between was not searched.
            lines.append(
                f"It fits on {_nodes(n)} of {profile.name} (rerun with --nodes {n}): {there}; "
                f"{_counts(more.searched)} do not, and the counts between were not searched."
            )
    else:
        lines.append(
            f"No node count up to {_nodes(profile.nodes * NODE_SCAN_FACTOR)} of {profile.name} makes it fit"
            f"{_pins_text(pins)}: "
            + ("drop some pins, or " if pins.pinned() else "")
            + "use GPUs with more memory, a shorter seq_length or a smaller global batch."
        )
    return " ".join(lines)


def _counts(counts: tuple[int, ...]) -> str:
    """Node counts in words, runs of consecutive counts as ranges: "33 to 64, 128 and 256 nodes"."""
    runs: list[list[int]] = []
    for c in counts:
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    words = [f"{r[0]} to {r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs]
    return (", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else words[0]) + " nodes"
