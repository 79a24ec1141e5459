"""The spec's overrides (orchestrator.spec.overrides) merged into the generated files, what each
replaced, and the ones refused.

Merging is deterministic: a ds_config key deep-merges into dsorch's config (yamlio.deep_merge, the
merge of a profile's ``extends``), so a mapping adds to dsorch's mapping and any other value replaces
dsorch's; a Megatron-LM flag dsorch emits is replaced where it stands (argparse would take the last
of two, but a reviewer should read one), any other flag is appended in the spec's order.

What dsorch derives from the layout, or from the spec keys the cost model reads, is refused: the
plan predicted memory and step time for its layout and model, and an override of those would run a
layout or a model it never predicted, one that may not fit. The fix is the plan's pin (`--tp 4`) or
the spec key, which the search then evaluates.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.plan.layout import AXES, AXIS
from orchestrator.runtimes import MEGATRON_ARGS, Runtime
from orchestrator.spec.overrides import Overrides
from orchestrator.spec.yamlio import deep_merge

# Megatron-LM flag -> the layout axes (orchestrator.plan.layout.AXES) or spec keys it is rendered from
# (render/megatron.py), for the flags an override may not set.
FLAG_OWNERS: Mapping[str, tuple[str, ...]] = {
    # The flag of each axis that has one, from its row (plan/layout.py AXES: Axis.megatron_flag).
    **{a.megatron_flag: (a.name,) for a in AXES if a.megatron_flag is not None},
    "--pipeline-model-parallel-layout": ("pp", "vpp"),
    "--account-for-embedding-in-pipeline-split": ("pp",),
    "--account-for-loss-in-pipeline-split": ("pp",),
    "--decoder-first-pipeline-num-layers": ("pp",),
    "--decoder-last-pipeline-num-layers": ("pp",),
    "--num-layers-per-virtual-pipeline-stage": ("vpp",),
    "--num-virtual-stages-per-pipeline-rank": ("vpp",),
    "--hierarchical-context-parallel-sizes": ("cp",),
    "--use-distributed-optimizer": ("zero_stage",),
    "--use-megatron-fsdp": ("zero_stage",),
    "--data-parallel-sharding-strategy": ("zero_stage",),
    "--recompute-granularity": ("recompute",),
    "--recompute-method": ("recompute", "recompute_layers"),
    "--recompute-num-layers": ("recompute_layers",),
    "--global-batch-size": ("training.global_batch_size",),
    "--seq-length": ("training.seq_length",),
    "--bf16": ("training.precision",),
    "--fp16": ("training.precision",),
    "--fp8-format": ("training.fp8",),
    "--num-layers": ("model.num_layers",),
    "--hidden-size": ("model.hidden_size",),
    "--ffn-hidden-size": ("model.ffn_hidden_size",),
    "--num-attention-heads": ("model.num_attention_heads",),
    "--group-query-attention": ("model.num_kv_heads",),
    "--num-query-groups": ("model.num_kv_heads",),
    "--kv-channels": ("model.kv_channels",),
    "--vocab-size": ("model.vocab_size",),
    "--make-vocab-size-divisible-by": ("model.vocab_size", "tp"),
    "--max-position-embeddings": ("model.max_position_embeddings",),
    "--num-experts": ("model.moe.num_experts",),
    "--moe-ffn-hidden-size": ("model.moe.ffn_hidden_size",),
    "--moe-router-topk": ("model.moe.top_k",),
    "--mtp-num-layers": ("model.mtp_layers",),
    # The data a run trains on is the spec's (and the plan records it).
    "--mock-data": ("training.data.path",),
    "--data-path": ("training.data.path",),
    "--train-data-path": ("training.data.path",),
    "--valid-data-path": ("training.data.path",),
    "--test-data-path": ("training.data.path",),
    "--split": ("training.data.split",),
    "--tokenizer-type": ("training.data.tokenizer",),
    "--tokenizer-model": ("training.data.tokenizer",),
}

# ds_config.json key (dotted) -> what it is rendered from (render/ds_config.py), for the keys an
# override may not set, nor replace a mapping above.
DS_CONFIG_OWNERS: Mapping[str, tuple[str, ...]] = {
    "train_batch_size": ("training.global_batch_size",),
    "train_micro_batch_size_per_gpu": ("micro_batch_size",),
    "gradient_accumulation_steps": ("grad_accum_steps",),
    "zero_optimization.stage": ("zero_stage",),
    # The entrypoint's full recomputation (train/loop/entry.py build_engine reads it).
    "pipeline.activation_checkpoint_interval": ("recompute",),
    # Measured wrong losses with sequence parallelism (render/ds_config.py).
    "pipeline.pipe_partitioned": ("tp", "sequence_parallel"),
    "pipeline.grad_partitioned": ("tp", "sequence_parallel"),
    "bf16.enabled": ("training.precision",),
    "fp16.enabled": ("training.precision",),
    # The memory model counts the fp32 accumulation buffer (costmodel/memory.py).
    "data_types.grad_accum_dtype": ("training.precision", "zero_stage"),
}

NOT_SET = "not set"
_ABSENT = object()


@dataclass(frozen=True, kw_only=True, slots=True)
class Change:
    """One override as plan.md lists it: where, which key, dsorch's value and the spec's."""

    file: str  # ds_config.json or megatron_args.txt
    key: str  # a dotted ds_config key or a flag
    before: str  # dsorch's value as the file writes it, NOT_SET when dsorch sets none
    after: str


def leaf_paths(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every non-mapping value of ``tree``, in its order."""
    for k, v in tree.items():
        key = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict) and v:
            yield from leaf_paths(v, key)
        else:
            yield key, v


def merge_ds_config(cfg: dict, overrides: Overrides) -> dict:
    return deep_merge(cfg, overrides.ds_config)


def merge_flags(flags: list[tuple[str, str | None]], overrides: Overrides) -> list[tuple[str, str | None]]:
    """dsorch's flags with each override replacing the same flag in place, the rest appended."""
    out = list(flags)
    where = {flag: i for i, (flag, _) in enumerate(out)}
    for flag, value in overrides.flags:
        if flag in where:
            out[where[flag]] = (flag, value)
        else:
            out.append((flag, value))
    return out


def _overlaps(a: str, b: str) -> bool:
    """One dotted key is the other or lies inside it: setting ``a`` changes ``b``."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _owner_text(owners: tuple[str, ...]) -> str:
    """Where the fix goes: the plan's pin of a layout axis, or the spec key."""
    parts = []
    for o in owners:
        axis = AXIS.get(o)
        if axis is None:
            parts.append(f"the spec's {o}")
        elif axis.flag is None:
            parts.append(f"the layout's {axis.label} (the global batch over --mbs x --dp: pin those)")
        else:
            pin = " or ".join(axis.flag.split("/")) if axis.kind is bool else f"{axis.flag} N"
            parts.append(f"the layout's {axis.label} (pin it: `dsorch plan SPEC {pin}`)")
    return " and ".join(parts)


def refusals(overrides: Overrides) -> list[str]:
    """One clause per override of what dsorch derives from the layout or the planned model."""
    out = []
    for i, (flag, _) in enumerate(overrides.flags):
        if flag in FLAG_OWNERS:
            out.append(f"overrides.megatron_args[{i}] ({flag}) is set by dsorch from {_owner_text(FLAG_OWNERS[flag])}")
    for key, _ in leaf_paths(overrides.ds_config):
        for owned, owners in DS_CONFIG_OWNERS.items():
            if _overlaps(key, owned):
                out.append(f"overrides.ds_config.{key} sets {owned}, which dsorch derives from {_owner_text(owners)}")
    return out


def refusal_message(spec: str, refused: list[str]) -> str:
    return (
        f"{spec}: {'; '.join(refused)}. The plan predicts memory and step time for the layout and model it "
        f"chooses, and these overrides would run another one, which may not fit or not run: drop them from "
        f"overrides, pin the layout with the plan's flags (--tp, --pp, --mbs, ...) or change the spec key. "
        f"Nothing was written."
    )


def invalid_message(spec: str, overrides: Overrides, errors: list[str]) -> str:
    """The validators' findings on the merged files, given that dsorch's own files pass them."""
    said = " ".join(errors)
    keys = [(f"overrides.ds_config.{k}", k.rsplit(".", 1)[-1]) for k, _ in leaf_paths(overrides.ds_config)]
    keys += [(f"overrides.megatron_args[{i}] ({f})", f) for i, (f, _) in enumerate(overrides.flags)]
    # The keys the findings name, else all of them (a finding about the whole file names none).
    named = [key for key, word in keys if word in said] or [key for key, _ in keys]
    hint = ""
    if any("is the string" in e for e in errors):
        # YAML 1.1 reads 5e8 as a string (a float needs a dot: 5.0e+8).
        hint = " (in YAML, 5e8 is a string: write 500000000 or 5.0e+8)"
    return (
        f"{spec}: the generated files with the spec's overrides do not validate, and without them they do: "
        f"{'; '.join(errors)}. Fix or remove {', '.join(named)} in the spec{hint}. "
        f"Nothing was written."
    )


def _json(v: Any) -> str:
    return json.dumps(v, separators=(", ", ": "))


def changes(cfg: dict | None, flags: list[tuple[str, str | None]], overrides: Overrides) -> list[Change]:
    """What each override replaced: ``cfg`` and ``flags`` as dsorch renders them before the merge
    (``cfg`` None: a plan without ds_config.json)."""
    out = []
    if cfg is not None:
        for key, value in leaf_paths(overrides.ds_config):
            node: Any = cfg
            for part in key.split("."):
                node = node.get(part, _ABSENT) if isinstance(node, dict) else _ABSENT
            before = NOT_SET if node is _ABSENT else _json(node)
            out.append(Change(file="ds_config.json", key=key, before=before, after=_json(value)))
    given = dict(flags)
    for flag, value in overrides.flags:
        before = NOT_SET if flag not in given else (given[flag] or "(switch)")
        out.append(Change(file="megatron_args.txt", key=flag, before=before, after=value or "(switch)"))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


_UNCHECKED = " (unchecked: not in the argument table dsorch validates with; Megatron-LM's parser reads it at start)"


def overrides_md(plan_changes: list[Change], runtime: Runtime, unchecked: frozenset[str], ds_unused: bool) -> list[str]:
    """plan.md's Overrides section (empty without overrides)."""
    paragraphs: list[list[str]] = []
    if plan_changes:
        rows = []
        for c in plan_changes:
            before = c.before if c.before == NOT_SET else f"`{_cell(c.before)}`"
            note = _UNCHECKED if c.key in unchecked else ""
            rows.append(f"| {c.file} | `{c.key}` | {before} | `{_cell(c.after)}`{note} |")
        paragraphs += [
            [
                "The spec's `overrides` set these values in the generated files; they are validated as dsorch's own "
                "(ds_config.json by DeepSpeed's config classes, megatron_args.txt by Megatron-LM's argument table)."
            ],
            ["| file | key | dsorch's value | override |", "|---|---|---|---|", *rows],
        ]
    if not runtime.reads_megatron_args and any(c.file == MEGATRON_ARGS for c in plan_changes):
        paragraphs.append(
            [
                "The deepspeed runtime's entrypoint reads ds_config.json, not megatron_args.txt: the flags "
                "apply when the spec is planned with `--runtime megatron`."
            ]
        )
    if ds_unused:
        paragraphs.append(
            ["A megatron plan has no ds_config.json: `overrides.ds_config` applies to `--runtime deepspeed`."]
        )
    out = ["## Overrides"] if paragraphs else []
    for p in paragraphs:
        out += ["", *p]
    return out
