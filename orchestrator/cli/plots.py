"""Pictures of a plan: memory per GPU, time per step, the pipeline schedule, and measured runs.

Drawn from plan.yaml alone (the stacks the search computed: the chosen layout and the alternatives), so that
``dsorch plot`` needs no search and draws what the plan says. Byte-deterministic SVG: text kept as
text (``svg.fonttype: none``, no embedded font), a fixed ``svg.hashsalt`` for the ids matplotlib
makes up, no date or creator in the metadata, and an id (``gid``) on every bar, so that a test or a
reviewer can find each bar and the number it stands for.

The chart data are plain functions (``memory_rows``, ``time_rows``, ``schedule``), kept apart from
the drawing, so the tests check the numbers and the SVG checks that they were drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.calibrate.records import read_steps
from orchestrator.costmodel.stacks import MEMORY_LABELS, MEMORY_PARTS, TIME_LABELS, TIME_PARTS, Label
from orchestrator.errors import ValidationError as PlanError
from orchestrator.plan.layout import Layout
from orchestrator.plandir.reader import PlanDir, ScoredDoc

if TYPE_CHECKING:  # matplotlib is imported only when a picture is drawn
    from matplotlib.typing import RcKeyType

# Colour-blind-safe (Okabe & Ito 2008), one per part, fixed so every plan reads the same.
_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#999999")
_RC: dict[RcKeyType, str | int | bool] = {
    "svg.fonttype": "none",
    "svg.hashsalt": "dsorch",
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


@dataclass(frozen=True)
class Row:
    label: str
    chosen: bool
    parts: dict[str, float]
    total: float


def _label(s: ScoredDoc) -> str:
    return Layout(**s.layout.model_dump()).short()


def predicted_step_s(pd: PlanDir, predicted: dict[str, float | str | None]) -> float:
    """The predicted step time of a plan.yaml ``predicted`` section. The section mixes numbers with
    the interval's basis in words, so its type cannot say that this entry is a number."""
    value = predicted["step_time_s"]
    if value is None:
        raise PlanError(f"{pd.path}/plan.yaml: predicted.step_time_s is empty; regenerate it with `dsorch plan`.")
    return float(value)


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
        Row(_label(s), i == 0, {k: s.time_breakdown_s[k] for k in TIME_PARTS}, predicted_step_s(pd, s.predicted))
        for i, s in enumerate(pd.ranked)
    ]


@dataclass(frozen=True)
class Block:
    stage: int
    kind: str  # "F" or "B"
    micro_batch: int
    chunk: int  # virtual stage (model chunk) of an interleaved schedule
    start: float
    end: float


def _order(stage: int, pp: int, m: int, v: int) -> list[tuple[str, int, int]]:
    """The order in which one stage runs its passes: (kind, micro-batch, chunk). 1F1B (Narayanan
    et al. 2021, Fig. 4 top): pp - stage - 1 warm-up forwards, then one forward and one backward in
    turn, then the remaining backwards. Interleaved (Fig. 4 bottom; Megatron-LM's
    forward_backward_pipelining_with_interleaving): passes go through the chunks in groups of pp
    micro-batches, with (pp - stage - 1) * 2 + (v - 1) * pp warm-up forwards."""
    total = m * v

    def forward(k: int) -> tuple[str, int, int]:
        group, within = divmod(k, pp * v)
        return "F", group * pp + within % pp, within // pp

    def backward(k: int) -> tuple[str, int, int]:
        group, within = divmod(k, pp * v)
        return "B", group * pp + within % pp, v - 1 - within // pp

    if v > 1:
        # Megatron-LM's get_pp_rank_microbatches (core/pipeline_parallel/schedules.py), capped at the
        # chunks there are. (Older Megatron-LM ran every forward first when m == pp; since the
        # tunable schedule it no longer does.)
        warm = min(total, (pp - stage - 1) * 2 + (v - 1) * pp)
    else:
        warm = min(total, pp - stage - 1)
    out = [forward(k) for k in range(warm)]
    f, b = warm, 0
    while f < total:
        out.append(forward(f))
        out.append(backward(b))
        f, b = f + 1, b + 1
    out += [backward(k) for k in range(b, total)]
    return out


def schedule(pp: int, m: int, v: int, t_forward: float, t_backward: float, t_send: float) -> list[Block]:
    """Each stage's passes on a time line: a pass starts when its stage is free and its input has
    arrived (the forward of chunk c from the stage before, or from the last stage's chunk c - 1; the
    backward the other way), ``t_send`` after the sender finished."""
    orders = [_order(s, pp, m, v) for s in range(pp)]
    done: dict[tuple[str, int, int, int], float] = {}
    cursor = [0] * pp
    free = [0.0] * pp
    blocks: list[Block] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(pp):
            while cursor[s] < len(orders[s]):
                kind, mb, c = orders[s][cursor[s]]
                if kind == "F":
                    dep = ("F", s - 1, mb, c) if s > 0 else ("F", pp - 1, mb, c - 1) if c > 0 else None
                else:
                    dep = ("B", s + 1, mb, c) if s < pp - 1 else ("B", 0, mb, c + 1) if c < v - 1 else ("F", s, mb, c)
                if dep is not None and dep not in done:
                    break
                ready = 0.0 if dep is None else done[dep] + (t_send if dep[1] != s else 0.0)
                start = max(free[s], ready)
                end = start + (t_forward if kind == "F" else t_backward)
                done[(kind, s, mb, c)] = end
                free[s] = end
                blocks.append(Block(s, kind, mb, c, start, end))
                cursor[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # a dependency cycle: a bug in _order, never the user's input
            raise RuntimeError(f"pipeline schedule deadlocks at pp={pp} m={m} v={v}")
    return blocks


def schedule_of(pd: PlanDir) -> tuple[list[Block], str]:
    """The chosen layout's schedule, timed by its predicted compute and sends, and a caption."""
    L = pd.doc.layout
    pp, v, m = L.pp, L.vpp, L.grad_accum_steps
    compute, send_total = pd.doc.time_breakdown_s["compute"], pd.doc.time_breakdown_s["pp_comm"]
    # Backward is about twice the forward (Narayanan et al. 2021, sec. 3.5); full recomputation
    # adds one more forward to it (Korthikanti et al. 2022, sec. 4).
    back = 3.0 if L.recompute == "full" else 2.0
    # Drawn as the papers draw it: a few micro-batches, enough for the warm-up, the steady state and
    # the drain (2 x pp, at least 8; a multiple of pp, as interleaving needs). All of the step is
    # the steady state repeated; the caption says how many are drawn.
    shown = min(m, max(2 * pp, 8))
    if v > 1:
        shown = min(m, -(-shown // pp) * pp)
    t_f = compute / (m * v) / (1.0 + back)
    sends = 2 * m * v
    t_send = send_total / sends if pp > 1 else 0.0
    kind = "interleaved 1F1B" if v > 1 else ("1F1B" if pp > 1 else "no pipeline")
    caption = (
        f"{kind}: pp {pp}"
        + (f", {v} chunks per stage" if v > 1 else "")
        + f", {m} micro-batches per step"
        + (f" (the first {shown} drawn; the steady state repeats)" if shown < m else "")
    )
    return schedule(pp, shown, v, t_f, back * t_f, t_send), caption


# ---- drawing -------------------------------------------------------------------------------


def _figure(width: float, height: float):
    import matplotlib
    from matplotlib.figure import Figure

    matplotlib.rcParams.update(_RC)
    return Figure(figsize=(width, height), dpi=100)


def _svg(fig) -> str:
    import io

    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None}, bbox_inches="tight")
    return buf.getvalue()


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
    fig = _figure(9.0, 1.2 + 0.42 * len(rows))
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
    return _svg(fig)


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


def draw_schedule(pd: PlanDir) -> str:
    blocks, caption = schedule_of(pd)
    pp = pd.doc.layout.pp
    fig = _figure(10.0, 1.3 + 0.32 * pp)
    ax = fig.add_subplot()
    shades = ("#56B4E9", "#0072B2", "#F0C05A", "#E69F00")  # forward blues, backward oranges; shade by chunk
    # One collection per stage and shade, touching passes of one shade merged into one bar: a
    # 405B schedule has thousands of passes, drawn one by one it is slow and megabytes of SVG.
    runs: dict[tuple[int, int], list[list[float]]] = {}
    for b in sorted(blocks, key=lambda b: (b.stage, b.start)):
        shade = (b.chunk % 2) + (2 if b.kind == "B" else 0)
        bars = runs.setdefault((b.stage, shade), [])
        if bars and abs(bars[-1][1] - b.start) <= 1e-9 * max(1.0, b.end):
            bars[-1][1] = b.end
        else:
            bars.append([b.start, b.end])
    dense = len(blocks) > 400  # white edges would wash thin passes out
    for (stage, shade), bars in sorted(runs.items()):
        ax.broken_barh(
            [(a, e - a) for a, e in bars],
            (pp - 1 - stage - 0.4, 0.8),
            facecolors=shades[shade],
            edgecolors="none" if dense else "white",
            linewidth=0.3,
            gid=f"schedule-stage{stage}-{'FFBB'[shade]}{shade % 2}",
        )
    if not dense:
        for b in blocks:
            ax.text(
                (b.start + b.end) / 2,
                pp - 1 - b.stage,
                str(b.micro_batch + 1),
                ha="center",
                va="center",
                fontsize=6,
                color="white",
            )
    ax.set_yticks(range(pp), [f"stage {s}" for s in range(pp)][::-1], fontsize=8)
    ax.set_xlabel("s (forward blue, backward orange, the shade alternating by chunk; gaps: bubble and sends)")
    ax.set_title(f"{pd.doc.model.name}: {caption}", loc="left")
    return _svg(fig)


def draw_steps(pd: PlanDir, runs: list[Path]) -> str:
    """Measured loss and step time per step of each run, against the predicted step time and its interval."""
    fig = _figure(9.0, 5.0)
    loss_ax, time_ax = fig.subplots(2, 1, sharex=True)
    predicted = predicted_step_s(pd, pd.doc.predicted)
    interval = pd.doc.predicted.get("step_time_interval")
    for i, run in enumerate(runs):
        recs = read_steps(run / "metrics.jsonl")
        steps = [r["step"] for r in recs]
        loss_ax.plot(steps, [r["loss"] for r in recs], label=run.name, gid=f"steps-loss-{i}")
        time_ax.plot(
            steps, [r["step_time_s"] for r in recs], marker=".", linewidth=0.8, label=run.name, gid=f"steps-time-{i}"
        )
    time_ax.axhline(
        predicted, color="#D55E00", linestyle="--", gid="steps-predicted", label=f"predicted {predicted:.4g} s"
    )
    if isinstance(interval, float):
        time_ax.axhspan(
            predicted * (1 - interval), predicted * (1 + interval), color="#D55E00", alpha=0.12, gid="steps-interval"
        )
    loss_ax.set_ylabel("loss")
    time_ax.set_ylabel("step time (s)")
    time_ax.set_xlabel("step")
    loss_ax.set_title(f"{pd.doc.model.name} on {pd.doc.cluster.name}: measured per step", loc="left")
    time_ax.legend(fontsize=8, frameon=False)
    return _svg(fig)


# The pictures of the plan alone, as plan.md embeds them: what `plan --check` redraws and compares
# when the plan directory has plots/. steps.svg is not one of them: it draws measured runs.
PICTURES = {"memory.svg": draw_memory, "time.svg": draw_time, "schedule.svg": draw_schedule}


def pictures(pd: PlanDir) -> dict[str, str]:
    """The plan's pictures as SVG text, by file name (in memory: `plan --check` compares them)."""
    return {name: draw(pd) for name, draw in PICTURES.items()}


def draw_all(pd: PlanDir, out: Path, runs: Sequence[Path] = ()) -> list[Path]:
    """Every picture of the plan into ``out``; the measured one only when runs are given."""
    from orchestrator.plandir.writer import write_text_atomic

    out.mkdir(parents=True, exist_ok=True)
    made = []
    for name, svg in pictures(pd).items():
        write_text_atomic(out / name, svg)
        made.append(out / name)
    measured = [r for r in runs if (r / "metrics.jsonl").is_file()]
    if measured:
        write_text_atomic(out / "steps.svg", draw_steps(pd, measured))
        made.append(out / "steps.svg")
    return made
