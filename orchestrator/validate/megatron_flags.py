"""megatron_args.txt read into (flag, value) pairs, and each flag checked on its own: what Megatron's
argparse parser would reject or silently mis-read (a value given to a switch or missing for an
option, ints/floats that do not parse, values outside ``choices``), with the ``type`` converters of
megatron/training/arguments.py that dsorch can reproduce (``moe_freq_type``, ``tuple_type``).
"""

from __future__ import annotations

import ast
import re
import shlex
from typing import Any

# argparse actions that consume no value (argparse.BooleanOptionalAction included).
_SWITCH_ACTIONS = {"store_true", "store_false", "store_const", "append_const", "count", "BooleanOptionalAction"}


def parse_args_lines(text: str) -> list[tuple[str, str | None]]:
    """Parse megatron_args.txt: one flag per line, ``--flag value`` or ``--flag`` alone.

    Blank lines and lines starting with ``#`` are ignored; ``--flag=value`` is accepted too
    (argparse accepts it).  Everything after the flag is the value, so multi-value flags
    (``--rampup-batch-size 16 16 1000``) keep all their tokens in one string.
    """
    flags: list[tuple[str, str | None]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        flag = parts[0]
        value = parts[1].strip() if len(parts) > 1 else None
        if value is None and flag.startswith("--") and "=" in flag:
            flag, value = flag.split("=", 1)
        flags.append((flag, value or None))
    return flags


def _tokens(value: str) -> list[str]:
    try:
        return shlex.split(value)
    except ValueError:  # unbalanced quotes: fall back to whitespace, the type check reports it
        return value.split()


def _convert(token: str, type_name: str | None):
    """Apply the argparse ``type`` converters we can reproduce; others pass the string."""
    if type_name == "int":
        return int(token)
    if type_name == "float":
        return float(token)
    if type_name == "moe_freq_type":
        return _freq(token)
    if type_name == "tuple_type":
        # arguments.py tuple_type: "127,0" or "(127,0)" -> (127, 0)
        return tuple(int(i) for i in token.strip("()").split(","))
    return token


# arguments.py _eval_pattern: the characters a layer pattern may hold before Megatron eval()s it.
_PATTERN_CHARS = re.compile(r"[^,\d\[\]\(\)\+\*]")
# dsorch evaluates the pattern itself (no eval) and stops at a length no model has.
MAX_PATTERN = 1_000_000


def _freq(token: str) -> int | list[int]:
    """arguments.py moe_freq_type (also --window-attn-skip-freq): an int, or a list expression
    such as ``([0]*3+[1]*58)`` when the value holds a '['."""
    if "[" not in token:
        return int(token)
    if _PATTERN_CHARS.search(token):
        raise ValueError(token)
    try:
        value = _pattern_value(ast.parse(token, mode="eval").body)
    except (SyntaxError, RecursionError) as e:
        raise ValueError(token) from e
    if not isinstance(value, list):
        raise ValueError(token)
    return value


def _pattern_value(node: ast.AST):
    """Lists, ints, + and * of a layer pattern, as Python would evaluate them (nothing else)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_pattern_value(e) for e in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _pattern_value(node.left), _pattern_value(node.right)
        if isinstance(node.op, ast.Mult) and isinstance(left, (list, tuple)) != isinstance(right, (list, tuple)):
            seq, n = (left, right) if isinstance(left, (list, tuple)) else (right, left)
            if len(seq) * max(n, 0) > MAX_PATTERN:
                raise ValueError("pattern too long")
            return seq * n
        if isinstance(node.op, ast.Add) and type(left) is type(right):
            return left + right
        if isinstance(node.op, ast.Mult) and isinstance(left, int) and isinstance(right, int):
            return left * right
    raise ValueError("not a layer pattern")


# What a value of each converter looks like, for the message when it does not convert.
_EXPECTS = {
    "int": "an integer",
    "float": "a number",
    "moe_freq_type": "an integer or a list expression of 0s and 1s such as ([0]*3+[1]*58)",
    "tuple_type": "comma-separated integers such as 127,0",
}


def check_one(flag: str, value: str | None, rec: dict[str, Any]) -> tuple[list[str], Any]:
    """Errors for one flag and its parsed value (True/False for switches, list for nargs)."""
    action, nargs, type_name = rec["action"], rec["nargs"], rec["type"]
    if action in _SWITCH_ACTIONS:
        if value is not None:
            return [
                f"{flag} is a switch and takes no value (got {value!r}): write {flag} alone on its line, or drop it"
            ], None
        if action == "BooleanOptionalAction":
            return [], not flag.startswith("--no-")
        return [], action != "store_false"
    if value is None:
        if nargs in ("?", "*"):
            return [], None
        return [f"{flag} needs a value: write '{flag} <value>'"], None

    tokens = _tokens(value)
    if nargs is None and len(tokens) != 1:
        return [f"{flag} takes exactly one value, got {len(tokens)} ({value!r}): pass a single value"], None
    if isinstance(nargs, int) and len(tokens) != nargs:
        return [f"{flag} takes exactly {nargs} values, got {len(tokens)} ({value!r})"], None

    errors, parsed = [], []
    for tok in tokens:
        try:
            converted = _convert(tok, type_name)
        except ValueError:
            errors.append(
                f"{flag} expects {_EXPECTS.get(type_name or '', 'a ' + str(type_name))}, got {tok!r}: pass such a value"
            )
            continue
        choices = rec.get("choices")
        if choices is not None and converted not in choices:
            errors.append(
                f"{flag} {tok!r} is not one of the allowed values {', '.join(map(str, choices))}: pick one of them"
            )
            continue
        parsed.append(converted)
    if errors:
        return errors, None
    return [], parsed if nargs not in (None, "?") else parsed[0]
