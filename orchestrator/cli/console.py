"""What the commands other than `dsorch plan` print for people (cli/plan_table.py has the plan's):
the profiles, jobs, trials, calibration and doctor tables and summaries. No I/O of its own beyond
the console it is given; the CLI decides where output goes."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from orchestrator.cli.plan_table import step_text


def profile_table(rows: list[dict]) -> Table:
    t = Table(show_edge=False, pad_edge=False)
    for col in ("name", "origin", "nodes", "GPUs/node", "GPU", "GiB", "description"):
        t.add_column(col)
    for r in rows:
        t.add_row(
            r["name"],
            r["origin"],
            str(r["nodes"] or "-"),
            str(r["gpus_per_node"] or "-"),
            r["gpu"] or "-",
            f"{r['gpu_memory_gib']:g}" if r["gpu_memory_gib"] else "-",
            r["description"],
        )
    return t


def job_table(records, evals: list[str]) -> Table:
    """One row per job; ``evals``: each job's latest validation loss (perplexity) @ step, or ""."""
    t = Table(show_edge=False, pad_edge=False)
    cols = ("job", "cluster", "plan", "state", "elapsed", "requeues", "step", "loss", "eval loss (ppl)")
    for col in (*cols, "submitted (UTC)"):
        t.add_column(col)
    for r, ev in zip(records, evals, strict=True):
        t.add_row(
            r.job_id,
            r.cluster,
            r.plan_dir,
            r.state,
            elapsed(r.elapsed_s),
            str(r.requeues),
            "" if r.last_step is None else str(r.last_step),
            "" if r.last_loss is None else f"{r.last_loss:.4f}",
            ev,
            r.submitted_at.replace("+00:00", ""),
        )
    return t


def elapsed(s: float | None) -> str:
    if s is None:
        return ""
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def calibration_summary(doc: dict, out) -> str:
    """`dsorch calibrate`'s report: per run, error before and after, what changed."""
    before, after = doc["step_time_error_before"], doc["step_time_error_after"]
    records = doc["records"]
    lines = [f"fitted {len(records)} measured run(s) on profile {doc['profile']}:"]
    for rec in records:
        if rec.get("out_of_memory"):
            lines.append(
                f"  {rec.get('id')}: peak at least {rec.get('measured_peak_gib')} GiB, predicted "
                f"{rec.get('predicted_peak_gib')} GiB (memory only)"
            )
            continue
        lines.append(
            f"  {rec.get('id')}: {rec.get('layout')}: measured {rec.get('measured_step_s')} s/step, predicted "
            f"{rec.get('predicted_before_s')} s before, {rec.get('predicted_after_s')} s after"
        )
    for key in sorted(set(before) | set(after)):
        b, a = before.get(key), after.get(key)
        if isinstance(b, float) and isinstance(a, float):
            lines.append(f"  step-time {key.replace('_', ' ')}: {100 * b:.1f}% before, {100 * a:.1f}% after")
    changed = {
        k: (doc["efficiency_before"].get(k), v)
        for k, v in doc["efficiency_after"].items()
        if doc["efficiency_before"].get(k) != v
    }
    for k, (b, a) in sorted(changed.items()):
        lines.append(f"  efficiency.{k}: {b} -> {a}")
    lines += [f"  note: {n}" for n in doc.get("notes", [])]
    if out is not None:
        lines.append(f"wrote {out}")
    return "\n".join(lines)


def trial_proposal_table(proposal) -> Table:
    """`dsorch trial`: what would be measured, and why."""
    t = Table(show_edge=False, pad_edge=False)
    for col in ("#", "family", "layout", "step s", "GiB/GPU", "why"):
        t.add_column(col)
    for i, p in enumerate(proposal.picks):
        t.add_row(
            str(i + 1),
            p.family,
            p.scored.layout.short(),
            step_text(p.scored),
            f"{p.scored.memory_gib['total']:.2f}",
            p.why,
        )
    return t


def trial_cost_text(proposal, steps: int) -> str:
    c = proposal.cost
    n = len(proposal.picks)
    worst = n * proposal.time_limit_s * c.gpus / 3600
    return (
        f"cost: {n} trials x {steps} steps on {c.gpus} GPUs, one after another: {c.gpu_hours:.3g} GPU-hours of "
        f"predicted steps ({c.seconds:.0f} s), plus start-up; at most {worst:.3g} GPU-hours if every trial ran "
        f"to its {proposal.time_limit_s / 60:.0f}-minute limit."
    )


def trial_state_table(manifest, records) -> Table:
    t = Table(show_edge=False, pad_edge=False)
    for col in ("trial", "layout", "job", "state", "step", "elapsed"):
        t.add_column(col)
    # One registry row per trial, in the manifest's order (run.trial.states).
    for e, r in zip(manifest.trials, records, strict=True):
        t.add_row(
            e.dir,
            e.layout,
            r.job_id,
            r.state,
            "" if r.last_step is None else f"{r.last_step}/{manifest.steps}",
            elapsed(r.elapsed_s),
        )
    return t


def trial_results_table(results) -> Table:
    """Predicted vs measured per trial."""
    t = Table(show_edge=False, pad_edge=False)
    for col in (
        "trial",
        "layout",
        "predicted s",
        "measured s",
        "error",
        "MFU",
        "predicted GiB",
        "measured GiB",
        "outcome",
    ):
        t.add_column(col)
    for r in results:
        err = "" if r.error is None else f"{100 * r.error:+.0f}%"
        t.add_row(
            r.entry.dir,
            r.entry.layout,
            f"{r.entry.predicted_step_s:.3g}",
            "" if r.measured_step_s is None else f"{r.measured_step_s:.3g}",
            err,
            "" if r.mfu is None else f"{100 * r.mfu:.1f}%",
            f"{r.entry.predicted_peak_gib:.2f}",
            "" if r.peak_mem_gib is None else f"{r.peak_mem_gib:.2f}",
            r.failure or "ok",
        )
    return t


def trial_summary(c, shown) -> str:
    """After the table: the calibration, the profile written, the winner and its evidence."""
    doc = c.report.as_dict()
    b, a = doc["step_time_error_before"], doc["step_time_error_after"]
    lines = [
        f"calibrated on {sum(r.failure is None for r in c.results)} finished trial(s): step-time error mean "
        f"{100 * b['mean']:.1f}% / max {100 * b['max']:.1f}% before, {100 * a['mean']:.1f}% / "
        f"{100 * a['max']:.1f}% after"
    ]
    lines += [f"  note: {n}" for n in doc.get("notes", [])]
    failed = [r for r in c.results if r.failure is not None]
    for r in failed:
        what = {
            "oom": "ran out of memory (evidence against the memory model: the calibrated profile's overhead "
            "now covers it)",
            "timeout": "ran past its time limit",
            "cancelled": "was cancelled",
            "error": "failed",
        }[r.failure]
        lines.append(f"  {r.entry.dir} {what}")
    lines.append(f"wrote profile {shown(c.profile_path)} (extends the original)")
    p = c.plan
    measured = (
        f"measured {c.measured_winner.measured_step_s:.3g} s in {c.measured_winner.entry.dir}"
        if c.measured_winner
        else "not among the trials: its prediction rests on the calibrated profile"
    )
    lines.append(
        f"re-planned with {c.profile_name}: {p.layout.short()}, predicted {p.chosen.step_time_s:.3g} s/step "
        f"({measured})"
    )
    lines.append(f"wrote {shown(c.plan_dir)}/ (evidence in plan.yaml); run it: dsorch submit {shown(c.plan_dir)}")
    return "\n".join(lines)


def _size(n: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:g} {unit}"
    return f"{n} B"


def doctor_report(data: dict, profile, expected) -> Group:
    """`dsorch doctor`: reachability, the bandwidth sweep, and the measured figures next to the
    profile's (as the cost model reads them)."""
    from orchestrator.run.doctor import latency_us, peak_busbw

    parts: list = []
    n = data["world_size"]
    reach = (
        "every rank reached every other (all-reduce exact; pairwise sends "
        + ("checked" if data["pairwise"] == "checked" else data["pairwise"])
        + ")"
    )
    if not data["allreduce_ok"]:
        reach = "[red]the all-reduce over every rank gave a wrong sum[/red]"
    if data["unreachable"]:
        pairs = ", ".join(f"{a}->{b}" for a, b in data["unreachable"][:20])
        reach = f"[red]{len(data['unreachable'])} rank pairs could not exchange a message: {pairs}[/red]"
    parts.append(f"{n} ranks on {data['nodes']} node(s) ({', '.join(data['hosts'][:8])}), {data['backend']}: {reach}")
    t = Table(show_edge=False, pad_edge=False)
    for col in ("group", "ranks", "op", "size", "time (us)", "algbw GB/s", "busbw GB/s"):
        t.add_column(col, justify="left" if col in ("group", "op") else "right")
    for r in data["results"]:
        t.add_row(
            r["group"],
            str(r["ranks"]),
            r["op"],
            _size(r["bytes"]),
            f"{r['time_us']:.1f}",
            f"{r['algbw_gbs']:.3g}",
            f"{r['busbw_gbs']:.3g}",
        )
    parts.append(t)
    lines = []
    for group, want, lat_want, what in (
        ("intra-node", expected.intra_gbs, expected.intra_latency_us, "intra_node.bandwidth_gbps / 2"),
        (
            "inter-node",
            expected.inter_gbs,
            expected.inter_latency_us,
            "inter_node.bandwidth_gbps / 8 x nics_per_node / gpus_per_node",
        ),
    ):
        got = peak_busbw(data, group)
        if got is None:
            lines.append(f"{group}: not measured (needs {'2 ranks per node' if group == 'intra-node' else '2 nodes'})")
            continue
        lines.append(
            f"{group}: peak bus bandwidth {got:.3g} GB/s; the profile says {want:.3g} GB/s ({what}): "
            f"measured / profile {got / want:.2f}. Latency {latency_us(data, group):.1f} us per hop; the "
            f"profile says {lat_want:g} us."
        )
    parts.append("\n".join(lines))
    return Group(*parts)
