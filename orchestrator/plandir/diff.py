"""What changed between two plan directories, in the user's terms: the inputs (and the fields of
the cluster profile and the model spec that changed), the layout, memory per GPU, the prediction,
the Megatron-LM flags and the ds_config.json keys, then which other files differ. For pull
requests that change a plan (`dsorch diff A B`); ``stale_inputs`` says the same of a plan that
`dsorch plan --check` finds stale."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from orchestrator.plan.layout import AXIS, Layout
from orchestrator.plandir.reader import PlanDir

# A value as a plan records it; None in a change: the key is absent on that side.
_V = TypeVar("_V")


@dataclass
class PlanDiff:
    inputs: list[tuple[str, object, object]] = field(default_factory=list)
    # The fields of the cluster profile and of the model spec as planned that differ (field_changes).
    profile: list[tuple[str, object, object]] = field(default_factory=list)
    spec: list[tuple[str, object, object]] = field(default_factory=list)
    layout: list[tuple[str, object, object]] = field(default_factory=list)
    memory: list[tuple[str, float | None, float | None]] = field(default_factory=list)
    predicted: list[tuple[str, float | str | None, float | str | None]] = field(default_factory=list)
    flags: list[tuple[str, str | None, str | None]] = field(default_factory=list)  # None: absent, "": a switch
    ds_config: list[tuple[str, object, object]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # other generated files that differ
    # The flags and dotted ds_config keys that either plan's spec overrides (spec.overrides): their
    # changes are the spec's, not dsorch's.
    overridden: frozenset[str] = frozenset()

    @property
    def empty(self) -> bool:
        return not any(
            (
                self.inputs,
                self.profile,
                self.spec,
                self.layout,
                self.memory,
                self.predicted,
                self.flags,
                self.ds_config,
                self.files,
            )
        )

    def as_dict(self) -> dict:
        def rows(items, keys=("name", "before", "after")):
            return [dict(zip(keys, x, strict=True)) for x in items]

        return {
            "inputs": rows(self.inputs),
            "cluster_profile": rows(self.profile),
            "model_spec": rows(self.spec),
            "layout": rows(self.layout),
            "memory_gib_per_gpu": rows(self.memory),
            "predicted": rows(self.predicted),
            "megatron_flags": rows(self.flags, ("flag", "before", "after")),
            "ds_config": rows(self.ds_config, ("key", "before", "after")),
            "files": self.files,
        }


def parse_flags(text: str) -> dict[str, str]:
    """megatron_args.txt (one flag and its values per line) as {flag: values}, "" for a switch."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(None, 1)
        if parts and parts[0].startswith("--"):
            out[parts[0]] = parts[1] if len(parts) > 1 else ""
    return out


def _flatten(obj, prefix: str = "") -> dict[str, object]:
    if isinstance(obj, dict):
        out: dict[str, object] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: obj}


def _changed(a: Mapping[str, _V], b: Mapping[str, _V], ordered: bool = False) -> list[tuple[str, _V | None, _V | None]]:
    """Keys whose values differ: in a's order then b's new keys (``ordered``), else sorted."""
    keys = list(dict.fromkeys([*a, *b])) if ordered else sorted(set(a) | set(b))
    return [(k, a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)]


def field_changes(before: dict, after: dict) -> list[tuple[str, object, object]]:
    """The fields of a cluster profile or model spec, as plan.yaml records them, whose values differ:
    dotted keys (``gpu.memory_gib``), in the file's order. One comparison for `dsorch diff` and
    `plan --check`."""
    return _changed(_flatten(before), _flatten(after), ordered=True)


def diff_plans(a: PlanDir, b: PlanDir) -> PlanDiff:
    d = PlanDiff()
    da, db = a.doc, b.doc
    ins_a = {
        "model spec": f"{da.spec.name} ({da.inputs.model_spec.sha256[:12]})",
        "cluster": f"{da.cluster.name}, {da.cluster.nodes} x {da.cluster.gpus_per_node} {da.cluster.gpu} "
        f"({da.inputs.cluster_profile.sha256[:12]})",
        "runtime": da.runtime,
        "dsorch": da.dsorch_version,
        "pinned": da.inputs.pinned,
        "memory margin GiB": da.inputs.memory_margin_gib,
    }
    ins_b = {
        "model spec": f"{db.spec.name} ({db.inputs.model_spec.sha256[:12]})",
        "cluster": f"{db.cluster.name}, {db.cluster.nodes} x {db.cluster.gpus_per_node} {db.cluster.gpu} "
        f"({db.inputs.cluster_profile.sha256[:12]})",
        "runtime": db.runtime,
        "dsorch": db.dsorch_version,
        "pinned": db.inputs.pinned,
        "memory margin GiB": db.inputs.memory_margin_gib,
    }
    d.inputs = _changed(ins_a, ins_b, ordered=True)
    # Plans written before plan.yaml recorded the profile (profile: null) show only its hash above.
    if da.profile is not None and db.profile is not None:
        d.profile = field_changes(da.profile, db.profile)
    d.spec = field_changes(da.spec.model_dump(mode="json"), db.spec.model_dump(mode="json"))
    la, lb = da.layout.model_dump(), db.layout.model_dump()
    d.layout = [(AXIS[k].label if k in AXIS else k, x, y) for k, x, y in _changed(la, lb, ordered=True)]
    d.memory = _changed(da.memory_gib_per_gpu, db.memory_gib_per_gpu, ordered=True)
    keys = ("step_time_s", "tokens_per_s", "mfu", "model_tflops_per_gpu", "time_to_train_days")
    d.predicted = _changed({k: da.predicted.get(k) for k in keys}, {k: db.predicted.get(k) for k in keys}, ordered=True)
    fa, fb = parse_flags(a.texts.get("megatron_args.txt", "")), parse_flags(b.texts.get("megatron_args.txt", ""))
    d.flags = _changed(fa, fb)
    ca = _flatten(json.loads(a.texts["ds_config.json"])) if "ds_config.json" in a.texts else {}
    cb = _flatten(json.loads(b.texts["ds_config.json"])) if "ds_config.json" in b.texts else {}
    d.ds_config = _changed(ca, cb)
    d.overridden = frozenset(
        key
        for ov in (da.spec.overrides, db.spec.overrides)
        for key in [*(f for f, _ in ov.flags), *_flatten(ov.ds_config)]
    )
    shown = {"megatron_args.txt", "ds_config.json", "plan.yaml", "plan.md"}
    d.files = sorted(n for n in set(a.texts) | set(b.texts) if n not in shown and a.texts.get(n) != b.texts.get(n))
    return d


def _fmt(v) -> str:
    if v is None:
        return "(absent)"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={x}" for k, x in v.items()) or "nothing"
    if isinstance(v, list):
        return ", ".join(map(str, v)) or "nothing"
    return str(v)


def _change(x, y, relative: bool) -> str:
    if relative and isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool) and x:
        return f"{_fmt(x)} -> {_fmt(y)} ({100 * (y / x - 1):+.1f} %)"
    return f"{_fmt(x)} -> {_fmt(y)}"


def _by_override(d: PlanDiff, key: str) -> str:
    """A mark on a flag or ds_config key that a spec's overrides set (or a key inside one they set)."""
    inside = any(key.startswith(o + ".") for o in d.overridden)
    return " (spec override)" if key in d.overridden or inside else ""


def diff_text(d: PlanDiff, name_a: str, name_b: str) -> str:
    if d.empty:
        return f"{name_a} and {name_b}: no differences.\n"
    out = [f"{name_a} -> {name_b}"]
    sections = (
        ("inputs", d.inputs, False),
        ("cluster profile fields", d.profile, False),
        ("model spec fields", d.spec, False),
        ("layout", d.layout, False),
        ("memory per GPU (GiB)", d.memory, True),
        ("prediction", d.predicted, True),
    )
    for title, rows, relative in sections:
        if rows:
            out.append(f"{title}:")
            out += [f"  {k}: {_change(x, y, relative)}" for k, x, y in rows]
    if d.flags:
        out.append("Megatron-LM flags:")
        for flag, x, y in d.flags:
            if x is None:
                line = f"  + {flag} {y}".rstrip()
            elif y is None:
                line = f"  - {flag} {x}".rstrip()
            else:
                line = f"  {flag}: {x} -> {y}"
            out.append(line + _by_override(d, flag))
    if d.ds_config:
        out.append("ds_config.json:")
        out += [f"  {k}: {_fmt(x)} -> {_fmt(y)}{_by_override(d, k)}" for k, x, y in d.ds_config]
    if d.files:
        out.append(f"also differ: {', '.join(d.files)}")
    return "\n".join(out) + "\n"


def stale_inputs(plan_dir, the_plan) -> list[str]:
    """Why a committed plan differs from what its inputs give now (`plan --check`): the cluster
    profile's and the spec's fields that changed since it was planned, and the layout it would get
    now. Empty when the committed plan.yaml cannot be read or its inputs are unchanged."""
    import yaml

    try:
        old = yaml.safe_load((plan_dir / "plan.yaml").read_text(encoding="utf-8"))
        inputs = old["inputs"]
        old_layout = old["layout"]
    except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError):
        return []
    lines = []
    for what, key, sha, now, name in (
        (
            "cluster profile",
            "cluster_profile",
            the_plan.profile_sha256,
            the_plan.profile.model_dump(mode="json"),
            the_plan.profile.name,
        ),
        ("model spec", "model_spec", the_plan.spec_sha256, the_plan.spec.model_dump(mode="json"), the_plan.spec_path),
    ):
        was = (inputs.get(key) or {}).get("sha256") if isinstance(inputs, dict) else None
        if was is None or was == sha:
            continue
        before = old.get("profile" if key == "cluster_profile" else "spec")
        if not isinstance(before, dict):
            lines.append(f"the {what} {name} changed since this plan was made (its sha256 {was[:12]} -> {sha[:12]}).")
            continue
        changes = field_changes(before, now)
        shown = "; ".join(f"{k} {_fmt(x)} -> {_fmt(y)}" for k, x, y in changes[:12])
        more = f"; and {len(changes) - 12} more" if len(changes) > 12 else ""
        if not shown and key == "cluster_profile" and (the_plan.nodes_override or the_plan.gpus_per_node_override):
            # The profile as planned is recorded with --nodes/--gpus-per-node applied: a change to
            # what they override leaves no field to name.
            shown = "only what --nodes/--gpus-per-node override here, or formatting"
        lines.append(f"the {what} {name} changed since this plan was made: {shown or 'formatting only'}{more}.")
    # A user profile that shadowed a shipped one of the same name: without its profiles directory
    # (--profiles-dir, $DSORCH_PROFILES_DIR, dsorch.yaml) the name finds the shipped one, and every
    # field of the difference above comes from that, not from a change to the profile.
    origin = (inputs.get("cluster_profile") or {}).get("origin") if isinstance(inputs, dict) else None
    if origin is not None and origin != the_plan.profile_origin:
        lines.append(
            f"the cluster profile {the_plan.profile.name} was a {origin} profile when planned and is a "
            f"{the_plan.profile_origin} one now; if the {origin} one was meant, pass its directory with "
            f"--profiles-dir (or $DSORCH_PROFILES_DIR, or profiles_dir in dsorch.yaml)."
        )
    if lines:
        now_layout = the_plan.layout.as_dict()
        if isinstance(old_layout, dict) and any(old_layout.get(k) != v for k, v in now_layout.items()):
            try:
                was = Layout(**old_layout).short()
            except (TypeError, ValueError):
                was = "the committed layout"
            lines.append(
                f"the best layout now: {the_plan.layout.short()} ({the_plan.chosen.step_time_s:.4g} s per "
                f"step), was {was}."
            )
        else:
            lines.append(f"the best layout is unchanged: {the_plan.layout.short()}.")
    return lines
