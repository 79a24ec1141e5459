"""Validate generated files: DeepSpeed's config classes for ds_config.json, Megatron-LM's argument
table for megatron_args.txt. Used right after rendering and by ``dsorch validate``."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.errors import InvalidFile
from orchestrator.runtimes import DS_CONFIG, MEGATRON_ARGS, Runtime, runtime_named
from orchestrator.spec.overrides import Overrides
from orchestrator.validate.deepspeed import validate_ds_config
from orchestrator.validate.megatron import (
    check_megatron_args,
    check_pretrain_needs,
    known_flags,
    megatron_version,
    parse_args_lines,
)

# A damaged file can produce thousands of findings, each quoting the damage: say enough to act on.
MAX_ERRORS, MAX_ERROR_CHARS = 20, 400


def _capped(errors: list[str]) -> list[str]:
    out = [e if len(e) <= MAX_ERROR_CHARS else e[:MAX_ERROR_CHARS] + " ..." for e in errors[:MAX_ERRORS]]
    if len(errors) > MAX_ERRORS:
        out.append(f"... and {len(errors) - MAX_ERRORS} more")
    return out


def unchecked_flags(overrides: Overrides) -> frozenset[str]:
    """The spec's override flags that Megatron-LM's argument table (megatron-core as pinned) does not
    know. They pass through unchecked rather than refused: Megatron-LM versions add flags faster than
    the table follows, and its own parser checks them when the job starts (scripts/check_megatron_lm.py
    runs it on a plan directory)."""
    known = known_flags()
    return frozenset(flag for flag, _ in overrides.flags if flag not in known)


def unchecked_note(overrides: Overrides) -> str | None:
    """`dsorch validate`'s word on the flags it passed unchecked."""
    flags = sorted(unchecked_flags(overrides))
    if not flags:
        return None
    return (
        f"not checked: {', '.join(flags)} (the spec's overrides): not in the argument table of megatron-core "
        f"{megatron_version()} that dsorch validates with; Megatron-LM's parser reads them when the job starts "
        f"(scripts/check_megatron_lm.py --megatron-lm CHECKOUT PLAN_DIR runs it now)"
    )


def validate_files(
    files: dict[str, str],
    *,
    dp: int,
    world_size: int,
    runtime: Runtime | str | None = None,
    overrides: Overrides | None = None,
) -> list[str]:
    """Errors of the generated files; ``overrides``: the spec's, whose unknown flags are not errors."""
    unchecked = unchecked_flags(overrides) if overrides is not None else frozenset()
    return _capped(_validate_files(files, dp=dp, world_size=world_size, runtime=runtime, unchecked=unchecked))


def _validate_files(
    files: dict[str, str], *, dp: int, world_size: int, runtime: Runtime | str | None, unchecked: frozenset[str]
) -> list[str]:
    errors: list[str] = []
    if DS_CONFIG in files:
        try:
            cfg = json.loads(files[DS_CONFIG])
        except json.JSONDecodeError as e:
            return [f"ds_config.json:{e.lineno}: not valid JSON ({e.msg})"]
        if not isinstance(cfg, dict):
            return ["ds_config.json: expected a JSON object at the top level"]
        errors += [f"ds_config.json: {e}" for e in validate_ds_config(cfg, dp)]
    if MEGATRON_ARGS in files:
        flags = [(f, v) for f, v in parse_args_lines(files[MEGATRON_ARGS]) if f not in unchecked]
        errors += [f"megatron_args.txt: {e}" for e in check_megatron_args(flags, world_size)]
        # What Megatron-LM's pretrain_gpt.py needs, where megatron_args.txt is its command line.
        if runtime is not None and runtime_named(runtime).reads_megatron_args:
            errors += [f"megatron_args.txt: {e}" for e in check_pretrain_needs(flags)]
    return errors


def validate_path(path: Path, dp: int | None = None, notes: list[str] | None = None) -> list[str]:
    """Validate a plan directory (through the one loader, which checks plan.yaml's schema and the
    recorded hashes), or a single ds_config.json (then ``dp`` is needed). ``notes`` gets what was
    left unchecked (unchecked_note)."""
    from orchestrator.plandir.reader import changed_message, load_plan_dir

    path = Path(path)
    if path.is_dir():
        pd = load_plan_dir(path, strict=False)
        note = unchecked_note(pd.spec.overrides)
        if notes is not None and note is not None:
            notes.append(note)
        return _capped([changed_message(path / name) for name in pd.changed]) + validate_files(
            pd.texts,
            dp=dp if dp is not None else pd.layout.dp,
            world_size=pd.doc.cluster.world_size,
            runtime=pd.runtime,
            overrides=pd.spec.overrides,
        )
    if not path.exists():
        raise InvalidFile(f"{path}: no such file or directory.")
    if dp is None:
        raise InvalidFile(
            f"{path}: a single ds_config.json needs its data-parallel size: pass --dp N "
            f"(DeepSpeed checks train_batch_size = micro-batch x accumulation x dp)."
        )
    try:
        cfg = json.loads(_read(path))
    except json.JSONDecodeError as e:
        raise InvalidFile(f"{path}:{e.lineno}: not valid JSON ({e.msg}).") from e
    except RecursionError:  # the message says it all; a chained recursion error adds nothing
        raise InvalidFile(f"{path}: nested too deeply to be a ds_config.json.") from None
    if not isinstance(cfg, dict):
        raise InvalidFile(f"{path}: expected a JSON object at the top level.")
    return _capped([f"{path.name}: {e}" for e in validate_ds_config(cfg, dp)])


def _read(path: Path) -> str:
    from orchestrator.plandir.reader import read_text

    return read_text(path)
