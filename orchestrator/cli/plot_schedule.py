"""The pipeline-schedule picture of a plan's chosen layout: each stage's forward and backward passes
on a time line, simulated (``schedule``, a plain function the tests check) from the schedule's
order of passes and the layout's predicted compute and send times, then drawn."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.cli.plot_figure import figure, svg_text
from orchestrator.plandir.reader import PlanDir


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


def draw_schedule(pd: PlanDir) -> str:
    blocks, caption = schedule_of(pd)
    pp = pd.doc.layout.pp
    fig = figure(10.0, 1.3 + 0.32 * pp)
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
    return svg_text(fig)
