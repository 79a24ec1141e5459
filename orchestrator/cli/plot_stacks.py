"""The stack pictures of a plan: memory per GPU and time per step (exposed communication only), one
bar per ranked layout, the chosen one first. The rows (``memory_rows``, ``time_rows``) are plain
functions kept apart from the drawing, so the tests check the numbers and the SVG checks that they
were drawn."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.cli.plot_figure import figure, svg_text
from orchestrator.costmodel.stacks import MEMORY_LABELS, MEMORY_PARTS, TIME_LABELS, TIME_PARTS, Label
from orchestrator.plan.layout import Layout
from orchestrator.plandir.reader import PlanDir, ScoredDoc, predicted_step_s

# Colour-blind-safe (Okabe & Ito 2008), one per part, fixed so every plan reads the same.
_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#999999")


@dataclass(frozen=True)
class Row:
    label: str
    chosen: bool
    parts: dict[str, float]
    total: float


def _label(s: ScoredDoc) -> str:
    return Layout(**s.layout.model_dump()).short()


def memory_rows(pd: PlanDir) -> tuple[list[Row], float]:
    """One row per ranked layout (the chosen first): its memory stack per GPU, and the capacity."""
    rows = [
        Row(_label(s), i == 0, {k: s.memory_gib_per_gpu[k] for k in MEMORY_PARTS}, s.memory_gib_per_gpu["total"])
        for i, s in enumerate(pd.ranked)
    ]
    return rows, float(pd.doc.explain["capacity_gib"])


def time_rows(pd: PlanDir) -> list[Row]:
    """One row per ranked layout: its step's time stack (exposed communication only)."""
    return [
        Row(_label(s), i == 0, {k: s.time_breakdown_s[k] for k in TIME_PARTS}, predicted_step_s(pd.path, s.predicted))
        for i, s in enumerate(pd.ranked)
    ]


def _stacked(
    rows: list[Row],
    parts: tuple[str, ...],
    labels: dict[str, Label],
    title: str,
    unit: str,
    prefix: str,
    fmt: str,
    limit: float | None = None,
) -> str:
    fig = figure(9.0, 1.2 + 0.42 * len(rows))
    ax = fig.add_subplot()
    names = [("* " if r.chosen else "") + r.label for r in rows]
    ys = list(range(len(rows)))[::-1]
    for j, key in enumerate(parts):
        left = [sum(r.parts[k] for k in parts[:j]) for r in rows]
        bars = ax.barh(
            ys,
            [r.parts[key] for r in rows],
            left=left,
            height=0.62,
            color=_COLOURS[j % len(_COLOURS)],
            label=labels[key].column,
        )
        for i, bar in enumerate(bars):
            bar.set_gid(f"{prefix}-{i}-{key}")
    for i, (y, r) in enumerate(zip(ys, rows, strict=True)):
        ax.text(sum(r.parts.values()), y, " " + format(r.total, fmt), va="center", gid=f"{prefix}-{i}-total")
    if limit is not None:
        ax.axvline(limit, color="#D55E00", linestyle="--", linewidth=1.2, gid=f"{prefix}-capacity")
        ax.text(limit, len(rows) - 0.4, f" capacity {limit:g} {unit}", color="#D55E00", va="bottom")
    ax.set_yticks(ys, names, fontsize=8)
    ax.set_xlabel(unit)
    ax.set_title(title, loc="left")
    ax.legend(
        ncols=len(parts),
        loc="upper center",
        bbox_to_anchor=(0.5, -0.5 / (1 + len(rows) / 4)),
        frameon=False,
        fontsize=8,
    )
    return svg_text(fig)


def draw_memory(pd: PlanDir) -> str:
    rows, capacity = memory_rows(pd)
    return _stacked(
        rows,
        MEMORY_PARTS,
        MEMORY_LABELS,
        f"{pd.doc.model.name} on {pd.doc.cluster.name}: memory per GPU (* chosen)",
        "GiB",
        "memory",
        ".1f",
        limit=capacity,
    )


def draw_time(pd: PlanDir) -> str:
    return _stacked(
        time_rows(pd),
        TIME_PARTS,
        TIME_LABELS,
        f"{pd.doc.model.name} on {pd.doc.cluster.name}: time per step, exposed communication (* chosen)",
        "s",
        "time",
        ".4g",
    )
