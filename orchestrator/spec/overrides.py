"""What a spec adds to the generated files: extra Megatron-LM flags and ds_config.json keys.

The spec is the committed source of truth, so the additions live in it (``overrides:`` at its top
level) rather than in hand-edits of the plan directory, whose files plan.yaml hash-locks. The
renderers merge them (orchestrator.render.overrides), the validators check the merged files as they
check generated ones, and plan.yaml carries them with the rest of the spec.

One item of ``megatron_args`` is one line of megatron_args.txt: ``--flag`` or ``--flag VALUE...``
(``--flag=VALUE`` is read as ``--flag VALUE``, as argparse reads it). launch.sh passes the file as
``$(cat megatron_args.txt)`` with globbing off, so a value is split on whitespace and quotes are
not removed: an item may not hold them.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field, JsonValue, model_validator

from orchestrator.spec.yamlio import FROZEN

# A flag name as Megatron-LM's argparse declares them (megatron/training/arguments.py): --words-with-dashes.
_FLAG = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_-]*")
# What `$(cat megatron_args.txt)` would carry as something other than the user meant.
_NOT_IN_A_WORD = re.compile(r"[\"'\\`$\x00-\x1f\x7f]")


def parse_flag_item(item: str) -> tuple[str, str | None]:
    """One ``megatron_args`` item as (flag, value); value None for a switch, several words joined
    by one space. Raises ValueError with the fix for an item that is not one flag."""
    words = item.split()
    if not words:
        raise ValueError("an empty item: write one flag and its value, e.g. '--log-interval 10'")
    head, rest = words[0], words[1:]
    if "=" in head:
        head, _, first = head.partition("=")
        rest = [first, *rest] if first else rest
    if not _FLAG.fullmatch(head):
        raise ValueError(
            f"{item!r} does not start with a flag: write one Megatron-LM flag per item, e.g. '--log-interval 10'"
        )
    bad = _NOT_IN_A_WORD.search(item)
    if bad:
        raise ValueError(
            f"{item!r} holds {bad.group()!r}: megatron_args.txt reaches Megatron-LM split on whitespace, without "
            f"shell quoting, so quotes, backslashes, '$' and control characters would arrive as they are; "
            f"write the value without them"
        )
    return head, " ".join(rest) or None


def _one_flag(item: str) -> str:
    parse_flag_item(item)  # its ValueError names the item and the fix; pydantic adds the index and line
    return item


class Overrides(BaseModel):
    """Additions to the generated files. ``megatron_args``: Megatron-LM flags, each appended to
    megatron_args.txt or replacing dsorch's value of the same flag. ``ds_config``: keys deep-merged
    into ds_config.json (a mapping merges into dsorch's mapping; any other value replaces it)."""

    model_config = FROZEN

    # Megatron-LM flags, one per item ('--flag' or '--flag VALUE'): each replaces dsorch's value of the same
    # flag in megatron_args.txt or is appended; flags dsorch derives from the layout or the planned model
    # are refused.
    megatron_args: tuple[Annotated[str, AfterValidator(_one_flag)], ...] = Field(default=(), max_length=1_000)
    # Keys deep-merged into ds_config.json: a mapping merges into dsorch's, any other value replaces it;
    # keys dsorch derives from the layout or the planned model are refused.
    ds_config: dict[str, JsonValue] = {}

    @model_validator(mode="after")
    def _one_flag_each(self) -> Overrides:
        seen: dict[str, int] = {}
        for i, item in enumerate(self.megatron_args):
            flag, _ = parse_flag_item(item)
            if flag in seen:
                raise ValueError(
                    f"megatron_args[{i}] gives {flag} again (first in megatron_args[{seen[flag]}]); keep one"
                )
            seen[flag] = i
        return self

    @property
    def flags(self) -> list[tuple[str, str | None]]:
        """The Megatron-LM flags as (flag, value), in the spec's order."""
        return [parse_flag_item(item) for item in self.megatron_args]

    @property
    def empty(self) -> bool:
        return not self.megatron_args and not self.ds_config
