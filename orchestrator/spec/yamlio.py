"""YAML reading for every input file: error messages must name the file and the line of the
offending key; pydantic only knows the key path, so the loader records the line of every key.
"""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator.errors import SpecError

# extra="forbid": a typo is an error, not a silently ignored key. allow_inf_nan=False: ".inf" and
# ".nan" are valid YAML floats but never a valid size, rate or bandwidth.
FROZEN = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# --------------------------------------------------------------------------------------------
# YAML loading with line numbers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Loaded:
    """A parsed YAML document with the line number (1-based) of every key path."""

    data: Any
    lines: dict[tuple, int]
    path: Path
    sha256: str


def _compose_lines(node: yaml.Node, prefix: tuple, out: dict[tuple, int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = (*prefix, key_node.value)
            out[key] = key_node.start_mark.line + 1
            _compose_lines(value_node, key, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[(*prefix, i)] = item.start_mark.line + 1
            _compose_lines(item, (*prefix, i), out)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML's last-wins hides typos)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:  # an unhashable key (a list or a mapping): the message says so
                raise yaml.constructor.ConstructorError(
                    None, None, "a mapping key must be a plain value", key_node.start_mark
                ) from None
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key '{key}' appears twice (first on line {seen[key] + 1}); keep one",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


# A spec, profile or dsorch.yaml is a page of YAML. Limits that stop hostile or broken input before
# it costs time or memory: the file's size (read no further: /dev/zero has no end), and the nodes
# its aliases expand to ("billion laughs": nine aliases of nine make 10^9 nodes from 1 KB).
MAX_YAML_BYTES = 1 << 20
MAX_YAML_NODES = 100_000


def read_input(path: Path) -> bytes:
    """The bytes of a regular file of at most MAX_YAML_BYTES; never blocks on a FIFO or a device."""
    import stat

    try:
        st = path.stat()
        if stat.S_ISDIR(st.st_mode):
            raise SpecError(f"{path}: is a directory; pass a YAML file.")
        if not stat.S_ISREG(st.st_mode):
            raise SpecError(f"{path}: not a regular file (a pipe or a device); pass a YAML file.")
        if st.st_size > MAX_YAML_BYTES:
            raise SpecError(
                f"{path}: {st.st_size:,} bytes; a spec or profile is at most {MAX_YAML_BYTES:,}. "
                f"Pass the YAML file itself."
            )
        with open(path, "rb") as fh:
            raw = fh.read(MAX_YAML_BYTES + 1)
        if len(raw) > MAX_YAML_BYTES:  # it grew while we looked
            raise SpecError(f"{path}: more than {MAX_YAML_BYTES:,} bytes; a spec or profile is smaller.")
        return raw
    except FileNotFoundError:  # the message names the path and the fix; the OSError adds nothing
        raise SpecError(
            f"{path}: no such file. Check the path (it is read relative to the current directory)."
        ) from None
    except OSError as e:
        raise SpecError(f"{path}: cannot be read ({e.strerror or e}).") from e


def _count_nodes(node: yaml.Node, path: Path, budget: list[int]) -> None:
    """Refuse documents whose aliases expand to more than MAX_YAML_NODES nodes."""
    stack = [node]
    while stack:
        n = stack.pop()
        budget[0] -= 1
        if budget[0] < 0:
            raise SpecError(
                f"{path}: more than {MAX_YAML_NODES:,} YAML values (counting what anchors and aliases "
                f"repeat); a spec or profile has a few hundred. Pass the right file, or write aliases out."
            )
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                stack.extend((k, v))
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)


def load_yaml(path: Path, empty_ok: bool = False) -> Loaded:
    """Parse a YAML mapping; ``empty_ok``: a file with no content (or only comments) is ``{}``."""
    raw = read_input(path)  # turns every OSError into a SpecError with the path
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(f"{path}: not UTF-8 text (byte {e.start}); save it as UTF-8.") from e
    loader = None
    try:
        loader = _UniqueKeyLoader(text)  # its reader refuses control characters here already
        # One parse: the node tree gives the line numbers, the same tree gives the data.
        node = loader.get_single_node()
        if node is not None:
            _count_nodes(node, path, [MAX_YAML_NODES])
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or str(e)
        raise SpecError(f"{where}: malformed YAML ({problem}). Fix the syntax at that line.") from e
    except (ValueError, OverflowError, RecursionError, AttributeError, TypeError) as e:
        # e.g. a date like 2024-02-30, or an explicit tag (!!timestamp, !!binary) on a value that is not one
        raise SpecError(
            f"{path}: a value cannot be read ({' '.join(str(e).split())[:200]}); quote it if it is "
            f"meant as a string, and drop explicit !!tags."
        ) from e
    finally:
        if loader is not None:
            loader.dispose()
    if data is None and empty_ok:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(
            f"{path}: expected a YAML mapping (key: value lines) at the top level, got {type(data).__name__}."
        )
    lines: dict[tuple, int] = {}
    if node is not None:
        _compose_lines(node, (), lines)
    return Loaded(data, lines, path, hashlib.sha256(raw).hexdigest())


def _valid_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names accepted at ``loc`` (a pydantic error location) of ``model``."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int) or not (isinstance(current, type) and issubclass(current, BaseModel)):
            continue
        field = current.model_fields.get(part)
        if field is None:
            return []
        ann = field.annotation
        current = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


MAX_ERRORS = 20


def format_validation(e: ValidationError, loaded: Loaded | list[Loaded], model: type[BaseModel], what: str) -> str:
    """One line per error: file:line, key, what is wrong, the fix. With a profile's ``extends``
    chain (most derived first), each error names the file that sets the key, not the child."""
    chain = loaded if isinstance(loaded, list) else [loaded]
    msgs = []
    errors = e.errors()
    if len(errors) > MAX_ERRORS:
        # One line per problem up to a page; a file with thousands of unknown keys is summarised.
        msgs.append(f"{chain[0].path}: {len(errors):,} problems; the first {MAX_ERRORS}:")
        errors = errors[:MAX_ERRORS]
    for err in errors:
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc) or "(top level)"
        where = str(chain[0].path)
        found = False
        for n in range(len(loc), 0, -1):
            for ld in chain:
                line = ld.lines.get(loc[:n])
                if line:
                    where, found = f"{ld.path}:{line}", True
                    break
            if found:
                break
        if err["type"] == "extra_forbidden":
            valid = _valid_keys(model, loc)
            hint = difflib.get_close_matches(str(loc[-1]), valid, n=1)
            fix = f"did you mean '{hint[0]}'? " if hint else ""
            msgs.append(f"{where}: unknown key '{key}' in the {what}; {fix}valid keys here: {', '.join(valid)}.")
        elif err["type"] == "missing":
            msgs.append(f"{where}: missing required key '{key}' in the {what}; add it.")
        else:
            got = err.get("input")
            got_s = f" (got {got!r})" if got is not None and not isinstance(got, dict) else ""
            msgs.append(f"{where}: key '{key}': {err['msg']}{got_s}.")
    return "\n".join(msgs)


def deep_merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for k, v in override.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
