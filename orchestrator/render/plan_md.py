"""plan.md: the plan as a reviewer reads it in a pull request.

The decision in prose (why this layout, in the terms of the seed's decision guide: data
parallelism while the model states fit, ZeRO-3/FSDP when they do not, tensor parallelism inside a
node, pipelining across nodes, context parallelism for long sequences), the runner-up and why it
lost, the memory and time stacks, and the inputs with their hashes. Every number is one the search
computed (``explain_doc``, ``SearchResult.families``): nothing is evaluated here. Byte-deterministic
like the other files; plan.yaml records its sha256.
"""

from __future__ import annotations

from orchestrator.costmodel.stacks import (
    MEMORY_KEYS,
    MEMORY_LABELS,
    MEMORY_PARTS,
    TIME_KEYS,
    TIME_LABELS,
    TIME_PARTS,
)
from orchestrator.plan.make import Plan
from orchestrator.plan.solver import Scored
from orchestrator.plandir.rundir import REQUEUE_REQUEST_FILE
from orchestrator.render.ds_config import ds_config
from orchestrator.render.explain import explain_doc, ranked_layouts, stacks
from orchestrator.render.megatron import megatron_flags
from orchestrator.render.notes import notes_text
from orchestrator.render.overrides import changes, overrides_md
from orchestrator.runtimes import DS_CONFIG
from orchestrator.spec.model import ModelSpec

# What each family is, for a reader who knows the words but not this model.
FAMILY_WORDS = {
    "data-parallel": "Data parallelism (DDP, ZeRO-1/2): every GPU holds the whole model",
    "zero3": "ZeRO-3 / FSDP: weights, gradients and optimizer sharded, each layer gathered when used",
    "tp-heavy": "Tensor parallelism (Megatron TP) inside a node, with DP or ZeRO-1/2 across",
    "pipeline": "Pipeline parallelism: layers split in stages across GPUs, 1F1B schedule",
    "context-parallel": "Context parallelism: the sequence split across GPUs, ring attention",
}


def _params(n: int, sep: str = " ") -> str:
    return f"{n / 1e9:.2f}{sep}B" if n >= 1e9 else f"{n / 1e6:.2f}{sep}M" if n >= 1e6 else f"{n:,}"


def params_words(m: ModelSpec, sep: str = " ") -> str:
    """The parameter counts as the plan output states them: the total; for a mixture of experts the
    active count per token too, with and without the input embedding (DeepSeek-V3's 37B and Qwen3's
    3.3B count it, GPT-OSS's 5.1B does not), and the MTP modules apart (DeepSeek-V3's 14B module
    holds copies of the embedding and the output head besides them)."""
    text = f"{_params(m.num_params, sep)} parameters"
    if m.moe is not None:
        text += (
            f" ({_params(m.active_params, sep)} active per token, "
            f"{_params(m.active_params - m.embedding_params, sep)} without the input embedding"
        )
        text += f"; MTP modules {_params(m.mtp_params, sep)} more)" if m.mtp_layers else ")"
    elif m.mtp_layers:
        text += f" (MTP modules {_params(m.mtp_params, sep)} more)"
    return text


def _gib(x: float) -> str:
    return f"{x:.1f} GiB"


def _s(x: float) -> str:
    return f"{x:.3g} s" if x < 10 else f"{x:.1f} s"


def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def _why_slower(chosen: Scored, other: Scored, n: int = 3) -> str:
    """Where ``other``'s step differs from the chosen layout's, the largest differences first."""
    a, b = stacks(chosen)[1], stacks(other)[1]
    deltas = sorted(((b[k] - a[k], k) for k in TIME_PARTS), key=lambda d: (-abs(d[0]), d[1]))
    parts = [f"{TIME_LABELS[k].words} {'+' if d >= 0 else '-'}{_s(abs(d))}" for d, k in deltas[:n] if abs(d) >= 5e-4]
    return ", ".join(parts) if parts else "the same time stack"


def _family_line(plan: Plan, fb) -> str:
    s = fb.scored
    cap = plan.result.capacity_gib
    words = FAMILY_WORDS[fb.family]
    if fb.rank is None:
        top = max(MEMORY_PARTS, key=lambda k: (s.memory_gib[k], k))
        return (
            f"- **{words}.** Does not fit: its leanest layout, `{s.layout.short()}`, needs "
            f"{_gib(s.memory_gib['total'])} of {_gib(cap)} per GPU, {_gib(s.memory_gib['total'] - cap)} over; "
            f"the largest part is {MEMORY_LABELS[top].words} ({_gib(s.memory_gib[top])}). "
            f"({fb.evaluated:,} layouts of this family evaluated.)"
        )
    if fb.rank == 1:
        return (
            f"- **{words}.** Chosen: `{s.layout.short()}`, {_s(s.step_time_s)} per step, "
            f"{_gib(s.memory_gib['total'])} per GPU."
        )
    gap = s.step_time_s / plan.chosen.step_time_s - 1.0
    return (
        f"- **{words}.** Best: `{s.layout.short()}` (rank {fb.rank}), {_s(s.step_time_s)} per step "
        f"({_pct(gap)}), {_gib(s.memory_gib['total'])} per GPU; compared with the chosen layout: "
        f"{_why_slower(plan.chosen, s)}."
    )


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|",
    ]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def _summary(plan: Plan, doc: dict) -> list[str]:
    """The title, the provenance, and the plan in four lines: model, cluster, prediction, how sure."""
    c, p, m, t = plan.chosen, plan.profile, plan.spec.model, plan.spec.training
    return [
        f"# {plan.spec.name} on {p.name}: `{c.layout.short()}`",
        "",
        (
            f"Generated by dsorch {plan.version} ({plan.runtime} runtime). Same inputs give this file byte for byte; "
            f"`dsorch plan --check` says when it is stale."
        ),
        "",
        (
            f"- **Model:** {plan.spec.name}, {params_words(m)}, sequence {t.seq_length:,}, "
            f"global batch {t.global_batch_size:,} sequences, {t.precision}"
            + (f" with FP8 GEMMs ({t.fp8})" if t.fp8 else "")
            + "."
        ),
        (
            f"- **Cluster:** {p.name}, {p.nodes} × {p.gpus_per_node} {p.gpu.name} ({p.world_size:,} GPUs, "
            f"{_gib(p.gpu.memory_gib)} each)."
        ),
        (
            f"- **Predicted:** {c.step_time_s:.4g} s per step, {c.tokens_per_s:,.0f} tokens/s, MFU "
            f"{100 * c.mfu:.1f} %, {_gib(c.memory_gib['total'])} of {_gib(doc['capacity_gib'])} per GPU."
        ),
        f"- **How sure:** {c.basis}.",
        *(f"- {n[0].upper()}{n[1:]}." for n in notes_text(plan)),
    ]


def _runner_up(plan: Plan, doc: dict) -> list[str]:
    """The second-ranked layout, where it loses, and whether the model can tell the two apart."""
    ranked = plan.result.ranked
    if len(ranked) < 2:
        return []
    c, r = plan.chosen, ranked[1]
    gap = r.step_time_s / c.step_time_s - 1.0
    out = [
        "",
        (
            f"**Runner-up:** `{r.layout.short()}`, {_s(r.step_time_s)} per step ({_pct(gap)}), "
            f"{_gib(r.memory_gib['total'])} per GPU. Compared with the chosen layout: {_why_slower(c, r)}."
        ),
    ]
    top = doc["top_two"]
    if top["within_model_error"] is None:
        out.append(
            "The chosen layout is outside the fitted domain, where the model's error is unknown: "
            "measure both before committing (`dsorch trial`)."
        )
    elif top["within_model_error"]:
        out.append(
            f"The gap is within the model's own error (max {100 * top['model_max_error']:.1f} %): "
            f"measure both before committing (`dsorch trial`)."
        )
    else:
        out.append(f"The gap is larger than the model's max error of {100 * top['model_max_error']:.1f} %.")
    return out


def _why(plan: Plan, doc: dict) -> list[str]:
    """The decision: the best of each family, the runner-up, the closest layout that does not fit."""
    out = [
        "## Why this layout",
        "",
        (
            f"The search evaluated {plan.result.evaluated:,} legal layouts; {plan.result.feasible:,} fit in "
            f"memory. The best of each family:"
        ),
        "",
    ]
    out += [_family_line(plan, fb) for fb in plan.result.families]
    out += _runner_up(plan, doc)
    rejected = doc["rejected_by_memory"]
    if rejected["count"]:
        close = rejected["closest"][0]
        out += [
            "",
            (
                f"{rejected['count']:,} layouts do not fit; the closest, `{close['layout']}`, "
                f"needs {_gib(close['needs_gib'])} ({_gib(close['over_gib'])} over)."
            ),
        ]
    return out


def _stacks(plan: Plan, doc: dict) -> list[str]:
    """The memory and time stacks of every ranked layout, the chosen one in bold."""
    rows = ranked_layouts(plan)
    names = [f"**{L.layout}**" if L.chosen else L.layout for L in rows]
    best = plan.chosen.step_time_s
    return [
        f"## Memory per GPU (GiB; capacity {doc['capacity_gib']:g})",
        "",
        *_table(
            ["layout", *(MEMORY_LABELS[k].column for k in MEMORY_KEYS)],
            [[name, *[f"{L.memory_gib[k]:.1f}" for k in MEMORY_KEYS]] for name, L in zip(names, rows, strict=True)],
        ),
        "",
        "## Time per step (s; exposed communication only)",
        "",
        *_table(
            ["layout", *(TIME_LABELS[k].column for k in TIME_KEYS), "vs chosen"],
            [
                [
                    name,
                    *[f"{L.time_s[k]:.3f}" for k in TIME_PARTS],
                    f"{L.step_time_s:.3f}",
                    # from the search's own times, as the prose above: plan.yaml's rounded gap would
                    # round a second time (2.446 % -> 0.0245 -> "+2.5 %")
                    _pct(L.scored.step_time_s / best - 1.0),
                ]
                for name, L in zip(names, rows, strict=True)
            ],
        ),
    ]


_PICTURES = (
    "## Pictures",
    "",
    "Drawn by `dsorch plot .` (or `dsorch plan --plot`) into `plots/`:",
    "",
    "![memory per GPU](plots/memory.svg)",
    "![time per step](plots/time.svg)",
    "![pipeline schedule](plots/schedule.svg)",
)


def _data_line(data) -> str:
    """training.data as both runtimes train on it: Megatron-LM gets it as --data-path, the bundled
    entrypoint reads the same prefixes (relative ones from the plan directory, where launch.sh runs
    Megatron-LM), and `dsorch submit --data` overrides it for one job."""
    tok = f"tokenizer {data.tokenizer.type}" + (f" `{data.tokenizer.model}`" if data.tokenizer.model else "")
    if data.path is None:
        return f"- data: synthetic tokens (Megatron-LM --mock-data; the entrypoint's synthetic sequences); {tok}"
    sets = ", ".join(f"`{p}`" + (f" (weight {w:g})" if w is not None else "") for w, p in data.blend())
    return f"- data: {sets}; split {data.split}; {tok} (relative paths from this directory)"


def _inputs(plan: Plan, file_hashes: dict[str, str], regenerate: str) -> list[str]:
    """What the plan was made from, how to make it again, and the other files with their sha256."""
    pins = plan.pins.pinned()
    return [
        "## Inputs",
        "",
        f"- model spec `{plan.spec_path}`, sha256 `{plan.spec_sha256}`",
        f"- cluster profile `{plan.profile.name}` ({plan.profile_origin}), sha256 `{plan.profile_sha256}`",
        _data_line(plan.spec.training.data),
        (
            f"- pinned: {', '.join(f'{k}={v}' for k, v in pins.items()) if pins else 'nothing'}; "
            f"memory margin {plan.memory_margin_gib:g} GiB"
        ),
        f"- regenerate: `{regenerate}`",
        "",
        "The other generated files (plan.yaml records the sha256 of each, and of this one):",
        "",
        *[f"- `{name}` `{digest}`" for name, digest in sorted(file_hashes.items())],
    ]


def _container(plan: Plan) -> list[str]:
    """Which command runs where when the profile names a container (spec/container.py)."""
    c = plan.profile.container
    if c is None:
        return []
    how = "srun's Pyxis options" if c.runtime == "pyxis" else f"`{c.command} exec`"
    return [
        f"## Container ({c.runtime}: `{c.image}`)",
        "",
        f"- In the container ({how}): each task of the job step: `launch.sh`, torchrun and the ranks "
        f"(job.sbatch); submitit's task and its rank (`dsorch submit`).",
        "- On the host: the batch script: its USR2/TERM traps, the stop file it touches, `scontrol requeue`, "
        "and the first node's address (`scontrol show node`); under `dsorch submit`, rank 0 asks for the "
        f"requeue with `{REQUEUE_REQUEST_FILE}` in the run directory and the batch script runs it.",
        "- Bound at the same path: the plan and run directories (and `dsorch submit`'s job folder), "
        f"besides the profile's mounts ({', '.join(f'`{m}`' for m in c.mounts) or 'none'}).",
    ]


def _overrides(plan: Plan, unchecked: frozenset[str]) -> list[str]:
    """The spec's overrides and what each replaced in the generated files."""
    ov = plan.spec.overrides
    has_ds_config = DS_CONFIG in plan.runtime.renders
    found = changes(ds_config(plan) if has_ds_config else None, megatron_flags(plan), ov)
    return overrides_md(found, plan.runtime, unchecked, ds_unused=not has_ds_config and bool(ov.ds_config))


def render_plan_md(
    plan: Plan, file_hashes: dict[str, str], regenerate: str, unchecked: frozenset[str] = frozenset()
) -> str:
    """The report. ``file_hashes``: sha256 of the other generated files (plan.yaml records this
    one's); ``regenerate``: the command that makes this directory again; ``unchecked``: override
    flags no table checks (render_all)."""
    doc = explain_doc(plan)
    sections = (
        _summary(plan, doc),
        _why(plan, doc),
        _stacks(plan, doc),
        _overrides(plan, unchecked),
        _PICTURES,
        _container(plan),
        _inputs(plan, file_hashes, regenerate),
    )
    out: list[str] = []
    for section in sections:
        if not section:
            continue
        if out:
            out.append("")  # a blank line between sections
        out += section
    return "\n".join(out) + "\n"
