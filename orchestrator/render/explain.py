"""Why this layout: memory and time stacks of the chosen layout and its alternatives, the layouts
memory rejected and by how much, and whether the top two are closer than the model can tell.

Pure functions of a ``Plan``: ``explain_doc`` (the ``explain:`` section of plan.yaml, rounded and
deterministic) and ``explain_text`` (what ``dsorch plan --explain`` prints). plan.yaml states each
layout's stacks once, in its chosen and ``alternatives`` sections (``report.scored_doc``); the
``explain:`` section names the ranked layouts in the same order, with what only it says of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.costmodel.stacks import MEMORY_KEYS, MEMORY_LABELS, TIME_KEYS, TIME_LABELS, TIME_PARTS
from orchestrator.plan.make import Plan
from orchestrator.plan.solver import Scored
from orchestrator.render.notes import notes_doc


def _r(x: float, nd: int = 3) -> float:
    return float(round(float(x), nd))


def stacks(s: Scored) -> tuple[dict, dict]:
    """The stacks the search computed, rounded as plan.yaml states them: nothing is evaluated again here."""
    return ({k: _r(s.memory_gib[k]) for k in MEMORY_KEYS}, {k: _r(s.time_s[k], 4) for k in TIME_PARTS})


@dataclass(frozen=True, kw_only=True, slots=True)
class Ranked:
    """A ranked layout as --explain's and plan.md's tables show it, with plan.yaml's numbers."""

    scored: Scored
    layout: str  # the short form
    chosen: bool
    memory_gib: dict[str, float]
    time_s: dict[str, float]
    step_time_s: float
    vs_chosen: float  # step time over the chosen layout's, minus 1


def ranked_layouts(plan: Plan) -> list[Ranked]:
    """The ranked layouts, the chosen one first (plan.yaml's chosen section, then its alternatives)."""
    best = plan.chosen.step_time_s
    out = []
    for s in plan.result.ranked:
        mem, t = stacks(s)
        out.append(
            Ranked(
                scored=s,
                layout=s.layout.short(),
                chosen=s.layout == plan.chosen.layout,
                memory_gib=mem,
                time_s=t,
                step_time_s=_r(s.step_time_s, 4),
                vs_chosen=_r(s.step_time_s / best - 1.0, 4),
            )
        )
    return out


def _model_error(plan: Plan) -> tuple[float | None, float | None, str | None]:
    eff = plan.decisions.efficiency
    return eff.mean_rel_error, eff.max_rel_error, eff.entry


def _close_call(plan: Plan) -> dict | None:
    ranked = plan.result.ranked
    if len(ranked) < 2:
        return None
    a, b = ranked[0], ranked[1]
    gap = b.step_time_s / a.step_time_s - 1.0
    # The chosen layout's own interval: None outside the fitted domain, where the model's error is
    # unknown and so is the verdict.
    max_err = a.interval
    # The runner-up may be the faster one: a near-tie the search resolved toward the chosen, simpler
    # layout (SearchResult.near_ties).
    within = None if max_err is None else bool(abs(gap) <= max_err)
    return {
        "first": a.layout.short(),
        "second": b.layout.short(),
        "gap": _r(gap, 4),
        "model_max_error": None if max_err is None else _r(max_err, 4),
        "within_model_error": within,
    }


def explain_doc(plan: Plan) -> dict:
    """The ``explain:`` section of plan.yaml: the ranking (its stacks are in the chosen and alternatives
    sections), rejections, model error."""
    res = plan.result
    layouts = [{"layout": r.layout, "chosen": r.chosen, "vs_chosen": r.vs_chosen} for r in ranked_layouts(plan)]
    rejected = [
        {"layout": s.layout.short(), "needs_gib": _r(s.memory_gib["total"]), "over_gib": _r(s.over_gib)}
        for s in res.closest
    ]
    eff = plan.decisions.efficiency  # the efficiencies the chosen layout was predicted with
    mean_err, max_err, entry = _model_error(plan)
    return {
        "efficiency": {k: _r(v, 4) for k, v in eff.values().items()},
        "efficiency_source": {f: src for f, src in eff.sources},
        "model_step_time_error": {
            "calibration": entry,
            "engine": eff.engine,
            "domain": eff.domain,
            "rows": eff.rows,
            "mean": None if mean_err is None else _r(mean_err, 4),
            "max": None if max_err is None else _r(max_err, 4),
            "confidence": plan.chosen.basis,
        },
        "capacity_gib": _r(res.capacity_gib),
        "layouts": layouts,
        "rejected_by_memory": {"count": res.rejected_memory, "closest": rejected},
        "ruled_out": dict(sorted(res.rejected_rules.items(), key=lambda kv: (-kv[1], kv[0]))),
        "top_two": _close_call(plan),
        "notes": notes_doc(plan),
    }


def _fmt_row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(
        c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    ).rstrip()


def explain_text(plan: Plan) -> str:
    """A readable report: the stacks of every ranked layout, the closest rejections, the close call."""
    doc = explain_doc(plan)
    out: list[str] = []
    err = doc["model_step_time_error"]
    src = err["calibration"] or "defaults (no calibration entry for this GPU)"
    e = ", ".join(f"{k} {v:g}" for k, v in doc["efficiency"].items())
    out.append(f"Efficiencies ({src}): {e}")
    if err["domain"] in ("fitted", "borrowed") and err["max"] is not None:
        out.append(
            f"Model step-time error of {err['calibration']} on its {err['rows']} published runs: mean "
            f"{100 * err['mean']:.1f}%, max {100 * err['max']:.1f}%"
        )
    out.append(f"Chosen layout's step time: {err['confidence']}")
    out.append("")
    out.append(f"Memory per GPU (GiB, binding pipeline stage; capacity {doc['capacity_gib']:g} GiB):")
    mh = ["layout", *(MEMORY_LABELS[k].column for k in MEMORY_KEYS)]
    rows = [
        [("* " if L.chosen else "  ") + L.layout, *[f"{L.memory_gib[k]:.1f}" for k in MEMORY_KEYS]]
        for L in ranked_layouts(plan)
    ]
    widths = [max(len(r[i]) for r in [mh, *rows]) for i in range(len(mh))]
    out += [_fmt_row(mh, widths), *[_fmt_row(r, widths) for r in rows]]
    out.append("")
    out.append("Time per step (s; exposed communication only):")
    th = ["layout", *(TIME_LABELS[k].column for k in TIME_KEYS), "vs best"]
    rows = [
        [
            ("* " if L.chosen else "  ") + L.layout,
            *[f"{L.time_s[k]:.3f}" for k in TIME_PARTS],
            f"{L.step_time_s:.3f}",
            f"{100 * L.vs_chosen:+.1f}%",
        ]
        for L in ranked_layouts(plan)
    ]
    widths = [max(len(r[i]) for r in [th, *rows]) for i in range(len(th))]
    out += [_fmt_row(th, widths), *[_fmt_row(r, widths) for r in rows]]
    if doc["ruled_out"]:
        out.append("")
        out.append("Ruled out before the search (combinations that break a rule; see orchestrator/plan/rules.py):")
        out += [f"  {n:,}  {reason}" for reason, n in doc["ruled_out"].items()]
    rej = doc["rejected_by_memory"]
    if rej["count"]:
        out.append("")
        out.append(f"Rejected by memory: {rej['count']} layouts. Closest to fitting:")
        for r in rej["closest"]:
            out.append(f"  {r['layout']}: needs {r['needs_gib']:.1f} GiB ({r['over_gib']:.1f} GiB over)")
    top = doc["top_two"]
    if top is not None:
        out.append("")
        gap = 100 * abs(top["gap"])
        if top["within_model_error"] is None:
            out.append(
                f"The top two layouts are {gap:.1f}% apart, and the chosen one is outside the fitted domain, "
                f"where the model's error is unknown: measure both ({top['first']} and {top['second']}) "
                f"before committing to one."
            )
        elif top["within_model_error"]:
            out.append(
                f"The top two layouts are {gap:.1f}% apart, within the model's own error "
                f"(max {100 * top['model_max_error']:.1f}% on its calibration set): measure both "
                f"({top['first']} and {top['second']}) before committing to one."
            )
        else:
            out.append(
                f"The chosen layout is {gap:.1f}% faster than the next ({top['second']}), more than the "
                f"model's max error of {100 * top['model_max_error']:.1f}%."
            )
    return "\n".join(out) + "\n"
