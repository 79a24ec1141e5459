"""What `dsorch plan` prints for people: the inputs, the ranked table of layouts, the chosen layout
with its memory stack and notes. No I/O of its own beyond the console it is given; the CLI decides
where output goes."""

from __future__ import annotations

from rich.table import Table

from orchestrator.costmodel.stacks import MEMORY_LABELS, MEMORY_PARTS
from orchestrator.plan.layout import AXIS, SHORT_ORDER
from orchestrator.render.notes import notes_text
from orchestrator.render.plan_md import params_words


def print_plan(
    con, the_plan, top: int, out: str | None, files: dict[str, str], cluster_note=None, default_out: bool = False
) -> None:
    """The plan as `dsorch plan` shows it: the inputs, the ranked table, the chosen layout."""
    shown = the_plan.result.ranked[:top]
    _print_inputs(con, the_plan, cluster_note)
    con.print(layout_table(shown))
    _print_marks(con, shown)
    _print_chosen(con, the_plan)
    if out is not None:
        con.print(
            f"wrote {out}/: {', '.join(files)}"
            + (" (the default plan directory; --out DIR to choose)" if default_out else ""),
            markup=False,
        )


def _print_inputs(con, the_plan, cluster_note) -> None:
    """The model, the cluster, and what the search evaluated and ruled out."""
    from rich.markup import escape

    m = the_plan.spec.model
    p = the_plan.profile
    r = the_plan.result
    con.print(
        f"[bold]{the_plan.spec.name}[/]: {params_words(m, sep='')}, seq {the_plan.spec.training.seq_length}, "
        f"global batch {the_plan.spec.training.global_batch_size}, {the_plan.spec.training.precision}"
    )
    con.print(
        f"[bold]{p.name}[/]: {p.nodes} node{'s' if p.nodes != 1 else ''} x {p.gpus_per_node} {p.gpu.name} "
        f"({p.gpu.memory_gib:g} GiB), "
        f"runtime {the_plan.runtime}" + (f" (cluster from {escape(cluster_note.origin)})" if cluster_note else "")
    )
    con.print(
        f"searched {r.evaluated} legal layouts: {r.feasible} fit, {r.rejected_memory} exceed "
        f"{r.capacity_gib:g} GiB per GPU"
    )
    if r.rejected_rules:
        ruled = sorted(r.rejected_rules.items(), key=lambda kv: (-kv[1], kv[0]))
        con.print("ruled out by the rules: " + "; ".join(f"{n:,} {reason}" for reason, n in ruled), markup=False)


def layout_table(shown) -> Table:
    """The ranked layouts, the chosen one marked *."""
    t = Table(show_edge=False, pad_edge=False)
    # The axes in short()'s order; one that short() leaves out at its neutral value has a column
    # only where a shown layout uses it.
    axes = [
        AXIS[n]
        for n in SHORT_ORDER
        if not AXIS[n].omit_neutral or any(getattr(s.layout, n) != AXIS[n].neutral for s in shown)
    ]
    for col in ("", *(a.column for a in axes), "GiB/GPU", "step s", "tokens/s", "MFU"):
        t.add_column(col, justify="left" if col in ("", "recompute") else "right")
    for i, s in enumerate(shown):
        cells = [_cell(getattr(s.layout, a.name)) for a in axes]
        t.add_row(
            "*" if i == 0 else "",
            *cells,
            f"{s.memory_gib['total']:.1f}",
            step_text(s),
            f"{s.tokens_per_s:,.0f}",
            f"{100 * s.mfu:.1f}%",
        )
    return t


def _print_marks(con, shown) -> None:
    """What the step-time column's ± and ? mean, for the marks the table uses."""
    if any(s.interval is not None for s in shown):
        con.print(
            "±: the model's largest error on published runs of the same engine and GPU, each held out of the fit",
            markup=False,
        )
    if any(s.interval is None for s in shown):
        con.print(
            "?: outside the fitted domain (no published runs of that engine on this GPU, or the layout goes "
            "beyond them): no interval",
            markup=False,
        )


def _print_chosen(con, the_plan) -> None:
    """The chosen layout's memory stack and step time, a note when memory is tight, the run's length."""
    best = the_plan.chosen
    mem = best.memory_gib
    parts = ", ".join(f"{MEMORY_LABELS[k].column} {mem[k]:.1f}" for k in MEMORY_PARTS)
    con.print(
        f"* chosen: {best.layout.short()}: {mem['total']:.1f} GiB per GPU ({parts}), {best.step_time_s:.3g} s "
        f"per step ({best.basis})",
        markup=False,
    )
    tight = memory_tight(best) if the_plan.memory_margin_origin is None else None
    for note in ([tight] if tight else []) + notes_text(the_plan):
        con.print(f"  note: {note}", markup=False)
    if the_plan.spec.training.train_steps:
        days = the_plan.spec.training.train_steps * best.step_time_s / 86400
        con.print(
            f"  {the_plan.spec.training.tokens:.3g} tokens in {the_plan.spec.training.train_steps} steps: "
            f"{days:.1f} days"
        )


def _cell(value) -> str:
    return ("yes" if value else "no") if isinstance(value, bool) else str(value)


def memory_tight(s) -> str | None:
    """A warning when a layout's memory is within the memory model's known error of the capacity."""
    from orchestrator.costmodel.calibration import memory_error

    err = memory_error()
    under = err.get("largest_under") or 0.0
    if not under or s.memory_gib["total"] < s.capacity_gib * (1 - under):
        return None
    return (
        f"{s.memory_gib['total']:.1f} GiB is within the memory model's error of the {s.capacity_gib:g} GiB "
        f"capacity (published peaks ran up to {100 * under:.1f}% above the prediction, {err['rows']} runs); "
        f"--memory-margin GIB keeps headroom"
    )


def step_text(s) -> str:
    """Step time with its interval: '36.8 ±6%', or '36.8 ?' outside any fitted domain."""
    return f"{s.step_time_s:.3g} " + ("?" if s.interval is None else f"±{100 * s.interval:.0f}%")
