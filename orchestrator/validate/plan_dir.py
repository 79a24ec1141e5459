"""Validate generated files: DeepSpeed's config classes for ds_config.json, Megatron-LM's argument
table for megatron_args.txt. Used right after rendering and by ``dsorch validate``."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from ..errors import ValidationError
from .deepspeed import validate_ds_config
from .megatron import check_megatron_args, check_pretrain_needs, parse_args_lines


def validate_files(files: dict[str, str], *, dp: int, world_size: int, runtime: str | None = None) -> list[str]:
    errors: list[str] = []
    if "ds_config.json" in files:
        try:
            cfg = json.loads(files["ds_config.json"])
        except json.JSONDecodeError as e:
            return [f"ds_config.json:{e.lineno}: not valid JSON ({e.msg})"]
        if not isinstance(cfg, dict):
            return ["ds_config.json: expected a JSON object at the top level"]
        errors += [f"ds_config.json: {e}" for e in validate_ds_config(cfg, dp)]
    if "megatron_args.txt" in files:
        flags = parse_args_lines(files["megatron_args.txt"])
        errors += [f"megatron_args.txt: {e}" for e in check_megatron_args(flags, world_size)]
        if runtime == "megatron":
            errors += [f"megatron_args.txt: {e}" for e in check_pretrain_needs(flags)]
    return errors


def validate_path(path: Path, dp: int | None = None) -> list[str]:
    """Validate a plan directory, or a single ds_config.json (then ``dp`` is needed)."""
    path = Path(path)
    if path.is_dir():
        plan_file = path / "plan.yaml"
        if not plan_file.exists():
            raise ValidationError(f"{path}: no plan.yaml here; pass a directory written by `dsorch plan --out`, "
                                  f"or a ds_config.json file with --dp.")
        try:
            doc = yaml.safe_load(_read(plan_file))
            dp_plan = int(doc["layout"]["dp"])
            world = int(doc["cluster"]["world_size"])
        except (yaml.YAMLError, KeyError, TypeError, ValueError) as e:
            raise ValidationError(f"{plan_file}: not a dsorch plan ({e}); regenerate it with `dsorch plan`.")
        files = {n: _read(path / n) for n in ("ds_config.json", "megatron_args.txt") if (path / n).exists()}
        if doc.get("runtime") == "deepspeed" and "ds_config.json" not in files:
            return [f"{path}: the deepspeed runtime needs ds_config.json, which is missing; regenerate the plan."]
        return validate_files(files, dp=dp if dp is not None else dp_plan, world_size=world,
                              runtime=doc.get("runtime"))
    if not path.exists():
        raise ValidationError(f"{path}: no such file or directory.")
    if dp is None:
        raise ValidationError(f"{path}: a single ds_config.json needs its data-parallel size: pass --dp N "
                              f"(DeepSpeed checks train_batch_size = micro-batch x accumulation x dp).")
    try:
        cfg = json.loads(_read(path))
    except json.JSONDecodeError as e:
        raise ValidationError(f"{path}:{e.lineno}: not valid JSON ({e.msg}).")
    if not isinstance(cfg, dict):
        raise ValidationError(f"{path}: expected a JSON object at the top level.")
    return [f"{path.name}: {e}" for e in validate_ds_config(cfg, dp)]


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValidationError(f"{path}: not UTF-8 text (byte {e.start}); regenerate it with `dsorch plan`.")
    except OSError as e:
        raise ValidationError(f"{path}: cannot be read ({e.strerror or e}).")
