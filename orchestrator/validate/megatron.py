"""Validate emitted Megatron-LM launch flags against Megatron-LM's real argument table.

The table (``megatron_args.json``, next to this file) is generated from the pinned megatron-core
wheel by ``scripts/refresh_megatron_args.py``; see its header for the version and sha256.

Two layers of checks, all returning human-readable error strings (never raising):

1. Per flag, what Megatron's argparse parser would reject or silently mis-read: unknown names
   (the parser is built with ``allow_abbrev=False`` in megatron/training/arguments.py
   ``parse_args``, so prefixes are not accepted), a value given to a switch or missing for an
   option, ints/floats that do not parse, values outside ``choices``, a flag given twice.
2. The layout cross-checks that Megatron performs after parsing -- in
   ``megatron/training/arguments.py:validate_args``, in
   ``megatron/core/transformer/transformer_config.py:TransformerConfig.__post_init__`` and in
   ``megatron/core/num_microbatches_calculator.py`` -- and that a parallel-layout planner can
   get wrong.  Where Megatron only warns or silently changes a setting (e.g. turns
   ``--sequence-parallel`` off when tp == 1) we report an error: dsorch should not emit a flag
   that Megatron ignores.
"""

from __future__ import annotations

import ast
import difflib
import functools
import json
import math
import re
import shlex
from importlib import resources
from typing import Any

_TABLE_FILE = "megatron_args.json"

# argparse actions that consume no value (argparse.BooleanOptionalAction included).
_SWITCH_ACTIONS = {"store_true", "store_false", "store_const", "append_const", "count", "BooleanOptionalAction"}


# --------------------------------------------------------------------------- the table


@functools.lru_cache(maxsize=1)
def load_table() -> dict[str, Any]:
    """The checked-in argument table (works for editable and regular installs)."""
    text = resources.files(__package__).joinpath(_TABLE_FILE).read_text(encoding="utf-8")
    return json.loads(text)


@functools.lru_cache(maxsize=1)
def _by_option() -> dict[str, dict[str, Any]]:
    return {opt: rec for rec in load_table()["arguments"] for opt in rec["option_strings"]}


def megatron_version() -> str:
    return load_table()["megatron_core_version"]


def known_flags() -> frozenset[str]:
    return frozenset(_by_option())


# --------------------------------------------------------------------------- parsing


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
_MAX_PATTERN = 1_000_000


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
            if len(seq) * max(n, 0) > _MAX_PATTERN:
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


# --------------------------------------------------------------------------- per-flag checks


def _check_one(flag: str, value: str | None, rec: dict[str, Any]) -> tuple[list[str], Any]:
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


# --------------------------------------------------------------------------- cross-checks


class _Args:
    """Parsed values by argparse ``dest``; ``get`` falls back to the table's default."""

    def __init__(self, values: dict[str, Any], given: dict[str, str]):
        self.values, self.given = values, given
        self._defaults = {rec["dest"]: rec.get("default") for rec in load_table()["arguments"]}

    def get(self, dest: str, default: Any = None) -> Any:
        if dest in self.values:
            return self.values[dest]
        value = self._defaults.get(dest)
        return default if value is None else value

    def has(self, dest: str) -> bool:
        return dest in self.values

    def flag(self, dest: str) -> str:
        """The flag spelling the user wrote (or the table's first one) for messages."""
        if dest in self.given:
            return self.given[dest]
        for rec in load_table()["arguments"]:
            if rec["dest"] == dest:
                return rec["option_strings"][0]
        return "--" + dest.replace("_", "-")


def _cross_checks(a: _Args, world_size: int) -> list[str]:
    tp = a.get("tensor_model_parallel_size", 1)
    pp = a.get("pipeline_model_parallel_size", 1)
    cp = a.get("context_parallel_size", 1)
    errors = _deprecated_flag_checks(a)
    # Megatron-LM's parser takes any int here and validate_args divides by them: 0 would end
    # there in a ZeroDivisionError, a negative size in a nonsense model-parallel size.
    degrees = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp, "context_parallel_size": cp}
    bad = [f"{a.flag(k)} {v} must be at least 1" for k, v in degrees.items() if v < 1]
    if bad:
        return errors + bad
    size_errors, dp = _world_size_checks(a, world_size, tp, pp, cp)
    errors += size_errors
    errors += _batch_size_checks(a, dp)
    errors += _required_model_size_checks(a)
    errors += _seq_length_checks(a, cp)
    errors += _pipeline_checks(a, pp)
    errors += _attention_checks(a, tp)
    errors += _precision_and_recompute_checks(a, tp)
    errors += _megatron_fsdp_checks(a)
    errors += _moe_checks(a, world_size, tp, pp)
    errors += _mla_checks(a)
    errors += _window_checks(a)
    errors += _activation_checks(a)
    return errors


def _deprecated_flag_checks(a: _Args) -> list[str]:
    """Deprecated flags validate_args rejects outright (megatron/training/arguments.py
    validate_args: "assert args.batch_size is None", warmup, model_parallel_size, and
    checkpoint_activations which prints and exit()s)."""
    errors, F = [], a.flag
    for dest, use in (
        ("batch_size", "--micro-batch-size"),
        ("warmup", "--lr-warmup-fraction"),
        ("model_parallel_size", "--tensor-model-parallel-size"),
        ("checkpoint_activations", "--recompute-granularity"),
    ):
        if a.has(dest) and a.get(dest) not in (None, False):
            errors.append(f"{F(dest)} is no longer valid in Megatron-LM {megatron_version()}: use {use} instead")
    return errors


def _world_size_checks(a: _Args, world_size: int, tp: int, pp: int, cp: int) -> tuple[list[str], int | None]:
    """Errors for the model-parallel size, and the data-parallel size (None where it has none).

    validate_args: "world size is not divisible by total_model_size"; total = tp * pp * cp *
    gtp_weight_remat_size, the latter derived from --tensor-parallel-num-weight-shards by
    model_parallel_config.py resolve_tensor_parallel_weight_shards."""
    errors, F = [], a.flag
    gtp = 1
    shards = a.get("tensor_parallel_num_weight_shards")
    if shards is not None:
        if shards < tp or shards % tp:
            errors.append(
                f"{F('tensor_parallel_num_weight_shards')} {shards} must be a multiple "
                f"of {F('tensor_model_parallel_size')} {tp}: use {tp} or a multiple"
            )
        else:
            gtp = shards // tp
    model_size = tp * pp * cp * gtp
    if world_size <= 0:
        errors.append(f"world size {world_size} must be positive")
    elif world_size % model_size:
        errors.append(
            f"world size {world_size} is not divisible by {F('tensor_model_parallel_size')} {tp} "
            f"x {F('pipeline_model_parallel_size')} {pp} x {F('context_parallel_size')} {cp}"
            + (f" x weight-shard factor {gtp}" if gtp > 1 else "")
            + f" = {model_size}: choose sizes whose product divides {world_size}"
        )
    else:
        # validate_args: args.data_parallel_size = args.world_size // total_model_size
        return errors, world_size // model_size
    return errors, None


def _batch_size_checks(a: _Args, dp: int | None) -> list[str]:
    """validate_args asserts micro_batch_size is set and > 0; num_microbatches_calculator.py
    ConstantNumMicroBatchesCalculator asserts global_batch_size % (micro_batch_size *
    data_parallel_size) == 0 unless --decrease-batch-size-if-needed; the ramp-up calculator has
    its own schedule."""
    F = a.flag
    mbs, gbs = a.get("micro_batch_size"), a.get("global_batch_size")
    if mbs is None:
        return ["--micro-batch-size is required by Megatron-LM: add '--micro-batch-size N'"]
    if mbs <= 0:
        return [f"{F('micro_batch_size')} {mbs} must be positive"]
    if (
        dp is not None
        and gbs is not None
        and not a.get("decrease_batch_size_if_needed")
        and a.get("rampup_batch_size") is None
        and gbs % (mbs * dp)
    ):
        return [
            f"{F('global_batch_size')} {gbs} is not divisible by {F('micro_batch_size')} "
            f"{mbs} x data-parallel size {dp} = {mbs * dp}: use a multiple of {mbs * dp}"
        ]
    return []


def _required_model_size_checks(a: _Args) -> list[str]:
    """validate_args: required_args list.  A hybrid pattern derives num_layers,
    encoder_num_layers stands in for num_layers."""
    F = a.flag
    hybrid = a.get("hybrid_layer_pattern") or a.get("hybrid_override_pattern")
    required = ("num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings")
    return [
        f"{F(dest)} is required by Megatron-LM: add '{F(dest)} N'"
        for dest in required
        if a.get(dest) is None and not (dest == "num_layers" and (hybrid or a.get("encoder_num_layers")))
    ]


def _seq_length_checks(a: _Args, cp: int) -> list[str]:
    errors, F = [], a.flag
    seq, max_pos = a.get("seq_length"), a.get("max_position_embeddings")
    if seq is not None and max_pos is not None and max_pos < seq:
        # validate_args: "max_position_embeddings must be greater than or equal to seq_length"
        errors.append(
            f"{F('max_position_embeddings')} {max_pos} is smaller than "
            f"{F('seq_length')} {seq}: set it to at least {seq}"
        )
    if seq is not None and cp > 1 and seq % (2 * cp):
        # validate_args: "seq-length should be a multiple of 2 * context-parallel-size"
        errors.append(
            f"{F('seq_length')} {seq} is not a multiple of 2 x "
            f"{F('context_parallel_size')} {cp} = {2 * cp}: pick a multiple of {2 * cp}"
        )
    return errors


def _megatron_fsdp_checks(a: _Args) -> list[str]:
    """validate_args on Megatron-FSDP (--use-megatron-fsdp) and its checkpoint format."""
    errors, F = [], a.flag
    fsdp, fmt = a.get("use_megatron_fsdp"), a.get("ckpt_format", "torch_dist")
    if fsdp and fmt != "fsdp_dtensor":
        # "Megatron-FSDP requires the `fsdp_dtensor` checkpointing format."
        errors.append(
            f"{F('use_megatron_fsdp')} saves only in the fsdp_dtensor format: add '--ckpt-format fsdp_dtensor'"
        )
    if fmt == "fsdp_dtensor" and not fsdp:
        # "--ckpt-format fsdp_dtensor is only tested with Megatron FSDP."
        errors.append("--ckpt-format fsdp_dtensor is only for Megatron-FSDP: add --use-megatron-fsdp or use torch_dist")
    if fsdp and a.get("optimizer", "adam") not in ("sgd", "adam"):
        # "Megatron-FSDP does not support the {optimizer} optimizer yet."
        errors.append(f"{F('use_megatron_fsdp')} supports only the adam and sgd optimizers: use --optimizer adam")
    if fsdp and a.get("megatron_fsdp_version", 1) == 2 and a.get("use_distributed_optimizer"):
        # "--megatron-fsdp-version 2 is not compatible with --use-distributed-optimizer"
        errors.append(
            "--megatron-fsdp-version 2 does not run on the distributed optimizer: drop "
            "--use-distributed-optimizer or use version 1"
        )
    return errors


# The three ways to give virtual pipeline stages; at most one may be set (validate_args).
_VPP_SPECS = (
    "num_layers_per_virtual_pipeline_stage",
    "num_virtual_stages_per_pipeline_rank",
    "pipeline_model_parallel_layout",
)


def _pipeline_checks(a: _Args, pp: int) -> list[str]:
    """Layer split over pipeline stages, mirroring validate_args' 'Uneven virtual pipeline
    parallelism' block and TransformerConfig.__post_init__ '# Uneven PP'."""
    F = a.flag
    num_layers = a.get("num_layers")
    if num_layers is None or a.get("hybrid_layer_pattern") or a.get("hybrid_override_pattern"):
        return []  # a hybrid pattern defines the split itself (validated by Megatron)
    set_ = [d for d in _VPP_SPECS if a.get(d) is not None]
    if len(set_) > 1:
        return [
            f"{' and '.join(F(d) for d in set_)} cannot be combined: "
            "keep only one way of specifying virtual pipeline stages"
        ]
    if a.get("pipeline_model_parallel_layout") is not None:
        return _layout_checks(a, num_layers, pp)
    vpp, errors = _virtual_pipeline_degree(a, num_layers, pp)
    first = a.get("decoder_first_pipeline_num_layers")
    last = a.get("decoder_last_pipeline_num_layers")
    if first is not None or last is not None:
        errors += _uneven_pp_checks(a, num_layers, pp, first, last, vpp)
    if vpp is not None:
        errors += _interleaving_checks(a, pp)
    return errors


def _layout_stages(text: str) -> list[str] | None:
    """core/transformer/pipeline_parallel_layer_layout.py parse_str_to_list: commas dropped, (x)*n and
    c*n unrolled, stages split on '|'; None where a character is not E, t, m or L."""

    def unroll(r: re.Match) -> str:
        if len(r.group(1)) * int(r.group(2)) > _MAX_PATTERN:
            raise ValueError("layout too long")
        return r.group(1) * int(r.group(2))

    text = text.replace(",", "")
    try:
        for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
            text = re.sub(pattern, unroll, text)
            if len(text) > _MAX_PATTERN:
                return None
    except ValueError:
        return None
    stages = text.split("|")
    return stages if all(set(st) <= set("EtmL") for st in stages) else None


def _layout_checks(a: _Args, num_layers: int, pp: int) -> list[str]:
    """--pipeline-model-parallel-layout against validate_args and PipelineParallelLayerLayout
    (validate_layer_layout): whole virtual stages per rank, the embedding first, the loss last, every
    decoder layer and MTP module once, MTP after the decoder layers; no other split flags beside it."""
    F, text = a.flag, a.get("pipeline_model_parallel_layout")
    flag = F("pipeline_model_parallel_layout")
    errors = [
        f"{flag} cannot be combined with {F(d)}: the layout places every layer itself"
        for d in (
            "account_for_embedding_in_pipeline_split",
            "account_for_loss_in_pipeline_split",
            "decoder_first_pipeline_num_layers",
            "decoder_last_pipeline_num_layers",
        )
        if a.get(d)
    ]
    stages = _layout_stages(text)
    if stages is None:
        return errors + [
            f"{flag} {text!r} is not a layout: it may hold only E (embedding), t (layer), m (MTP), L (loss), |, "
            "(...)*n and c*n, for at most a million slots"
        ]
    if len(stages) % pp:
        errors.append(f"{flag} has {len(stages)} stages, not a multiple of {F('pipeline_model_parallel_size')} {pp}")
    flat = "".join(stages)
    mtp = a.get("mtp_num_layers") or 0
    if not flat.startswith("E") or not flat.endswith("L") or flat.count("E") != 1 or flat.count("L") != 1:
        errors.append(f"{flag} must start with the embedding (E) and end with the loss (L), once each")
    if flat.count("t") != num_layers:
        errors.append(f"{flag} places {flat.count('t')} layers (t) but {F('num_layers')} is {num_layers}")
    if flat.count("m") != mtp:
        errors.append(f"{flag} places {flat.count('m')} MTP modules (m) but {F('mtp_num_layers')} is {mtp}")
    elif mtp and "t" in flat[flat.index("m") :]:
        errors.append(f"{flag} puts an MTP module (m) before a decoder layer (t): MTP comes after the layers")
    return errors


def _virtual_pipeline_degree(a: _Args, num_layers: int, pp: int) -> tuple[int | None, list[str]]:
    """The virtual pipeline degree the flags give (None: no interleaving, or the flags are wrong)
    and what is wrong with them."""
    errors: list[str] = []
    F = a.flag
    per_vstage = a.get("num_layers_per_virtual_pipeline_stage")
    vstages = a.get("num_virtual_stages_per_pipeline_rank")
    first = a.get("decoder_first_pipeline_num_layers")
    last = a.get("decoder_last_pipeline_num_layers")
    # account_for_* add one pseudo-layer each to the split (validate_args).
    total = (
        num_layers
        + int(bool(a.get("account_for_embedding_in_pipeline_split")))
        + int(bool(a.get("account_for_loss_in_pipeline_split")))
    )
    vpp = None
    if per_vstage is not None:
        if first is not None or last is not None:
            errors.append(
                f"{F('num_layers_per_virtual_pipeline_stage')} cannot be used with "
                "uneven first/last pipeline stages: use "
                "--num-virtual-stages-per-pipeline-rank instead"
            )
        elif total % pp:
            errors.append(
                f"{F('num_layers')} {total} is not divisible by "
                f"{F('pipeline_model_parallel_size')} {pp}: choose a pipeline size "
                f"that divides {total}"
            )
        elif per_vstage <= 0 or (total // pp) % per_vstage:
            errors.append(
                f"{F('num_layers_per_virtual_pipeline_stage')} {per_vstage} does not divide the "
                f"{total // pp} layers per pipeline stage ({F('num_layers')} {total} / "
                f"{F('pipeline_model_parallel_size')} {pp}): choose a divisor of {total // pp}"
            )
        else:
            vpp = (total // pp) // per_vstage
    elif vstages is not None:
        vpp = vstages
    elif first is None and last is None and total % pp:
        errors.append(
            f"{F('num_layers')} {total} is not divisible by "
            f"{F('pipeline_model_parallel_size')} {pp}: choose a pipeline size that "
            f"divides {total}, or set --decoder-first/last-pipeline-num-layers"
        )
    if vpp == 1:
        vpp = None  # validate_args: "if args.virtual_pipeline_model_parallel_size == 1: None"
    return vpp, errors


def _interleaving_checks(a: _Args, pp: int) -> list[str]:
    """validate_args: interleaved schedule needs pp > 1 with p2p overlap (the default,
    --no-overlap-p2p-communication turns it off) and pp > 2 without it."""
    F = a.flag
    overlap = a.get("overlap_p2p_comm", True)
    minimum = 1 if overlap else 2
    if pp > minimum:
        return []
    flag = (
        F("num_layers_per_virtual_pipeline_stage")
        if a.get("num_layers_per_virtual_pipeline_stage") is not None
        else F("num_virtual_stages_per_pipeline_rank")
    )
    return [
        f"{flag} enables the interleaved schedule, which needs "
        f"{F('pipeline_model_parallel_size')} > {minimum}"
        + ("" if overlap else " when --no-overlap-p2p-communication is set")
        + f" (got {pp}): drop {flag} or raise the pipeline size"
    ]


def _uneven_pp_checks(a: _Args, num_layers: int, pp: int, first, last, vpp) -> list[str]:
    """TransformerConfig.__post_init__ '# Uneven PP' block."""
    errors, F = [], a.flag
    if a.get("account_for_embedding_in_pipeline_split") or a.get("account_for_loss_in_pipeline_split"):
        errors.append(
            "--decoder-first/last-pipeline-num-layers cannot be combined with "
            "--account-for-embedding/loss-in-pipeline-split: use one or the other"
        )
    middle_layers, middle_stages = num_layers, pp
    for dest, n in (("decoder_first_pipeline_num_layers", first), ("decoder_last_pipeline_num_layers", last)):
        if n is None:
            continue
        if n <= 0:
            errors.append(f"{F(dest)} {n} must be larger than 0")
        elif vpp is not None and n % vpp:
            errors.append(
                f"{F(dest)} {n} is not divisible by the virtual pipeline degree {vpp}: use a multiple of {vpp}"
            )
        middle_layers -= n
        middle_stages -= 1
    if bool(middle_layers) != bool(middle_stages) or middle_layers < 0 or middle_stages < 0:
        errors.append(
            f"uneven pipeline split leaves {middle_layers} layers for {middle_stages} "
            f"middle stages ({F('num_layers')} {num_layers}, "
            f"{F('pipeline_model_parallel_size')} {pp}): adjust the first/last stage "
            "layer counts"
        )
    elif middle_stages and middle_layers % middle_stages:
        errors.append(
            f"the {middle_layers} middle layers are not divisible by the "
            f"{middle_stages} middle pipeline stages: adjust the first/last stage "
            "layer counts"
        )
    elif middle_stages and vpp is not None and (middle_layers // middle_stages) % vpp:
        errors.append(
            f"{middle_layers // middle_stages} layers per middle pipeline rank are "
            f"not divisible by the virtual pipeline degree {vpp}"
        )
    return errors


def _attention_checks(a: _Args, tp: int) -> list[str]:
    errors: list[str] = []
    F = a.flag
    heads, hidden = a.get("num_attention_heads"), a.get("hidden_size")
    if heads is None:
        return errors
    if tp and heads % tp:
        # TransformerConfig.__post_init__: "num_attention_heads must be a multiple of
        # tensor_model_parallel_size"
        errors.append(
            f"{F('num_attention_heads')} {heads} is not divisible by "
            f"{F('tensor_model_parallel_size')} {tp}: choose a tensor-parallel size "
            f"that divides {heads}"
        )
    if hidden is not None and a.get("kv_channels") is None and heads and hidden % heads:
        # validate_args: kv_channels defaults to hidden_size // num_attention_heads and
        # asserts hidden_size % num_attention_heads == 0.
        errors.append(
            f"{F('hidden_size')} {hidden} is not divisible by "
            f"{F('num_attention_heads')} {heads}: set --kv-channels or fix the sizes"
        )
    if a.get("group_query_attention"):
        groups = a.get("num_query_groups", 1)
        if groups <= 0 or heads % groups:
            # megatron/core/transformer/attention.py Attention.__init__ divides
            # num_attention_heads by num_query_groups.
            errors.append(
                f"{F('num_attention_heads')} {heads} is not divisible by "
                f"{F('num_query_groups')} {groups}: use a divisor of {heads}"
            )
        elif groups % tp and tp % groups:
            # TransformerConfig.__post_init__: "num_query_groups must be a multiple or divisor
            # of tensor_model_parallel_size"
            errors.append(
                f"{F('num_query_groups')} {groups} is neither a multiple nor a "
                f"divisor of {F('tensor_model_parallel_size')} {tp}: change one of "
                "them"
            )
    elif a.has("num_query_groups"):
        # argument_utils.py core_transformer_config_from_args sets num_query_groups = None
        # unless args.group_query_attention: the value would be silently ignored.
        errors.append(
            f"{F('num_query_groups')} has no effect without --group-query-attention: "
            "add --group-query-attention or drop the flag"
        )
    return errors


def _precision_and_recompute_checks(a: _Args, tp: int) -> list[str]:
    errors, F = [], a.flag
    if a.get("fp16") and a.get("bf16"):
        # validate_args: "if args.fp16: assert not args.bf16" (and TransformerConfig).
        errors.append("--fp16 and --bf16 are mutually exclusive: keep only one")

    if a.get("sequence_parallel") and tp == 1:
        # validate_args: "Disabling sequence parallelism because tensor model parallelism is
        # disabled" -- Megatron silently turns it off, so emitting it is a planner bug.
        errors.append(
            f"{F('sequence_parallel')} requires {F('tensor_model_parallel_size')} > 1 "
            "(Megatron silently disables it at tp 1): drop --sequence-parallel"
        )
    if a.get("tp_comm_overlap") and not (a.get("sequence_parallel") and tp > 1):
        # validate_args: "Tensor parallel communication/GEMM overlap can happen only when
        # sequence parallelism is enabled"
        errors.append(
            f"{F('tp_comm_overlap')} requires --sequence-parallel with tp > 1: add "
            "--sequence-parallel or drop --tp-comm-overlap"
        )

    granularity = a.get("recompute_granularity")
    if a.get("recompute_activations"):
        granularity = "selective"  # validate_args maps --recompute-activations to selective
    method, nlayers = a.get("recompute_method"), a.get("recompute_num_layers")
    if granularity == "full":
        # TransformerConfig.__post_init__: full recompute needs recompute_method in
        # {uniform, block} and recompute_num_layers set.
        if method is None:
            errors.append(
                "--recompute-granularity full needs --recompute-method "
                "(uniform or block): add '--recompute-method uniform'"
            )
        if nlayers is None:
            errors.append("--recompute-granularity full needs --recompute-num-layers: add '--recompute-num-layers 1'")
        elif nlayers < 1:
            errors.append(f"{F('recompute_num_layers')} {nlayers} must be at least 1")
        elif method == "block" and a.get("num_layers"):
            per_rank = a.get("num_layers") // max(a.get("pipeline_model_parallel_size", 1), 1)
            if nlayers > per_rank:
                # TransformerConfig's message: "recompute_num_layers must be between 1 and
                # num_layers_per_pipeline_rank"
                errors.append(
                    f"{F('recompute_num_layers')} {nlayers} exceeds the {per_rank} "
                    "layers per pipeline rank for --recompute-method block: use at "
                    f"most {per_rank}"
                )
    elif granularity == "selective":
        if method is not None:
            # validate_args: "recompute method is not yet supported for selective
            # recomputing granularity"
            errors.append(
                f"{F('recompute_method')} is not supported with "
                "--recompute-granularity selective: drop --recompute-method"
            )
        if nlayers is not None:
            # TransformerConfig.__post_init__: selective -> "recompute_num_layers must be None"
            errors.append(
                f"{F('recompute_num_layers')} must not be set with "
                "--recompute-granularity selective: drop --recompute-num-layers"
            )
    else:
        for dest in ("recompute_method", "recompute_num_layers"):
            if a.has(dest):
                # Without a granularity TransformerConfig never looks at these.
                errors.append(
                    f"{F(dest)} has no effect without --recompute-granularity full: "
                    "add '--recompute-granularity full' or drop the flag"
                )
    if a.get("distribute_saved_activations") and (tp <= 1 or granularity != "full"):
        # validate_args: distribute_saved_activations needs tp > 1 and full recompute.
        errors.append(
            "--distribute-saved-activations needs --tensor-model-parallel-size > 1 and --recompute-granularity full"
        )
    return errors


# --------------------------------------------------------------------------- mixture of experts


def _one(value):
    """validate_args turns a one-element --moe-router-load-balancing-type/--moe-aux-loss-coeff
    list into its element."""
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def _moe_checks(a: _Args, world_size: int, tp: int, pp: int) -> list[str]:
    """validate_args' "MoE Spec check" and "Expert parallelism check", the expert mesh of
    core/parallel_state.py initialize_model_parallel, and TransformerConfig.__post_init__'s MoE
    block."""
    F = a.flag
    experts = a.get("num_experts") or None  # validate_args: --num-experts 0 means no MoE
    ep = a.get("expert_model_parallel_size", 1)
    etp = a.get("expert_tensor_parallel_size") or tp  # validate_args: defaults to tp
    bad = [
        f"{F(k)} {v} must be at least 1"
        for k, v in (("expert_model_parallel_size", ep), ("expert_tensor_parallel_size", etp))
        if v < 1
    ]
    if bad:
        return bad
    if experts is None:
        return _moe_flags_without_experts(a, ep)
    errors = []
    if experts < 0:
        return [f"{F('num_experts')} {experts} must be positive"]
    if experts % ep:
        errors.append(
            f"{F('num_experts')} {experts} is not divisible by {F('expert_model_parallel_size')} {ep}: "
            f"each expert-parallel rank holds the same number of experts; choose an ep dividing {experts}"
        )
    mesh = etp * ep * pp
    if world_size > 0 and world_size % mesh:
        errors.append(
            f"world size {world_size} is not divisible by {F('expert_tensor_parallel_size')} {etp} x "
            f"{F('expert_model_parallel_size')} {ep} x {F('pipeline_model_parallel_size')} {pp} = {mesh}: "
            f"Megatron-Core carves each pipeline stage's {world_size // pp} GPUs into expert-TP x EP x "
            f"expert-data-parallel groups; choose etp x ep dividing {world_size // pp}"
        )
    if a.get("add_bias_linear", True) and etp > 1:
        errors.append(
            f"biased linear layers (no --disable-bias-linear) in the experts need "
            f"{F('expert_tensor_parallel_size')} 1 (Megatron-Core: bias in MoE is only supported with "
            f"ETP 1): use --expert-tensor-parallel-size 1 or --disable-bias-linear"
        )
    errors += _moe_layer_checks(a)
    errors += _router_checks(a, experts)
    errors += _dispatcher_checks(a, ep, etp)
    if a.get("overlap_moe_expert_parallel_comm"):
        errors += _ep_overlap_checks(a, ep, pp)
    return errors


def _moe_flags_without_experts(a: _Args, ep: int) -> list[str]:
    F = a.flag
    errors = []
    if ep > 1:
        # validate_args: "num_experts must be non None to use expert model parallelism"
        errors.append(
            f"{F('expert_model_parallel_size')} {ep} splits experts and there are none: add --num-experts "
            "or use --expert-model-parallel-size 1"
        )
    # Megatron reads the --moe-* settings only when a MoE layer exists; --moe-ffn-hidden-size alone
    # is an error of TransformerConfig.__post_init__ (unless --moe-layer-freq leaves layers dense).
    for dest in sorted(a.given):
        if dest.startswith("moe_") or dest == "overlap_moe_expert_parallel_comm":
            errors.append(f"{a.given[dest]} has no effect without --num-experts: add --num-experts or drop the flag")
    return errors


def _moe_layer_checks(a: _Args) -> list[str]:
    """Which layers are MoE and the shared experts beside the routed ones."""
    errors, F = [], a.flag
    freq, num_layers = a.get("moe_layer_freq", 1), a.get("num_layers")
    if isinstance(freq, int) and freq < 1:
        # gpt_layer_specs.py: layer i is MoE when i % moe_layer_freq == 0
        errors.append(f"{F('moe_layer_freq')} {freq} must be at least 1 (every freq-th layer is MoE)")
    elif isinstance(freq, list):
        if num_layers is not None and len(freq) != num_layers:
            # gpt_layer_specs.py get_gpt_decoder_layer_specs: "Invalid length of moe_layer_pattern"
            errors.append(
                f"{F('moe_layer_freq')} lists {len(freq)} layers but {F('num_layers')} is {num_layers}: "
                "give one 0 (dense) or 1 (MoE) per layer"
            )
        if any(v not in (0, 1) for v in freq):
            errors.append(f"{F('moe_layer_freq')} may hold only 0 (dense layer) and 1 (MoE layer)")
    shared = a.get("moe_shared_expert_intermediate_size")
    if shared is None:
        errors += [
            f"{F(d)} has no effect without --moe-shared-expert-intermediate-size: drop it or add shared experts"
            for d in ("moe_shared_expert_gate", "moe_shared_expert_overlap")
            if a.get(d)
        ]
        return errors
    if shared <= 0:
        errors.append(f"{F('moe_shared_expert_intermediate_size')} {shared} must be positive")
    if a.get("add_bias_linear", True):
        # SharedExpertMLP.__init__: "bias is not supported in the shared experts"
        errors.append(
            "shared experts take no biases in Megatron-Core: add --disable-bias-linear or drop "
            f"{F('moe_shared_expert_intermediate_size')}"
        )
    if a.get("moe_shared_expert_overlap") and a.get("moe_token_dispatcher_type", "allgather") not in (
        "alltoall",
        "flex",
    ):
        errors.append(
            f"{F('moe_shared_expert_overlap')} overlaps the shared experts with the alltoall or flex "
            "dispatcher only: set --moe-token-dispatcher-type alltoall or drop it"
        )
    return errors


# Load balancing that leaves the tokens to the capacity check (TransformerConfig.__post_init__).
_CAPACITY_BALANCING = ("aux_loss", "seq_aux_loss", "global_aux_loss", "none")


def _router_checks(a: _Args, experts: int) -> list[str]:
    """TransformerConfig.__post_init__ on the router; moe_utils.topk_routing_with_score_function."""
    errors, F = [], a.flag
    topk, score = a.get("moe_router_topk", 2), a.get("moe_router_score_function", "softmax")
    balancing, coeff = _one(a.get("moe_router_load_balancing_type", "aux_loss")), _one(a.get("moe_aux_loss_coeff"))
    if not 1 <= topk <= experts:
        errors.append(f"{F('moe_router_topk')} {topk} must be between 1 and {F('num_experts')} {experts}")
    pre = a.get("moe_router_pre_softmax")
    if topk == 1 and score == "softmax" and not pre and balancing != "sinkhorn":
        errors.append(
            f"{F('moe_router_topk')} 1 with the softmax router needs --moe-router-pre-softmax: a softmax over "
            "the one chosen expert is always 1 and gives the router no gradient"
        )
    if pre and score != "softmax":
        errors.append(
            f"{F('moe_router_pre_softmax')} has no effect with {F('moe_router_score_function')} {score} "
            "(its scores are renormalized over the top k anyway): drop it"
        )
    errors += _group_topk_checks(a, experts)
    if a.get("moe_router_enable_expert_bias") and score not in ("sigmoid", "sqrtsoftplus"):
        errors.append(
            f"{F('moe_router_enable_expert_bias')} (auxiliary-loss-free balancing) works with the sigmoid or "
            f"sqrtsoftplus score function only: set --moe-router-score-function sigmoid or drop it"
        )
    if isinstance(balancing, list) and (not isinstance(coeff, list) or len(coeff) != len(balancing)):
        errors.append(
            f"{F('moe_router_load_balancing_type')} lists {len(balancing)} types: give "
            f"{F('moe_aux_loss_coeff')} one coefficient for each"
        )
    errors += _capacity_checks(a, balancing)
    return errors


def _group_topk_checks(a: _Args, experts: int) -> list[str]:
    F = a.flag
    groups, group_topk = a.get("moe_router_num_groups"), a.get("moe_router_group_topk")
    if group_topk is None:
        if groups is not None:
            return [f"{F('moe_router_num_groups')} has no effect without --moe-router-group-topk: add it or drop it"]
        return []
    if not groups:
        return [f"{F('moe_router_group_topk')} needs --moe-router-num-groups (group-limited routing)"]
    errors = []
    if experts % groups:
        errors.append(
            f"{F('num_experts')} {experts} is not divisible by {F('moe_router_num_groups')} {groups}: "
            "choose a group count dividing the experts"
        )
    if group_topk > groups:
        errors.append(f"{F('moe_router_group_topk')} {group_topk} is above {F('moe_router_num_groups')} {groups}")
    return errors


def _capacity_checks(a: _Args, balancing) -> list[str]:
    errors, F = [], a.flag
    capacity = a.get("moe_expert_capacity_factor")
    if capacity is not None and capacity < 0:
        # TransformerConfig.__post_init__ turns a negative factor into None (dropless), silently.
        errors.append(
            f"{F('moe_expert_capacity_factor')} {capacity} is negative, which Megatron reads as dropless: "
            "drop the flag for dropless routing, or give a positive factor"
        )
    elif capacity is not None:
        types = balancing if isinstance(balancing, list) else [balancing]
        if any(t not in _CAPACITY_BALANCING for t in types):
            errors.append(
                f"{F('moe_expert_capacity_factor')} works with the load-balancing types "
                f"{', '.join(_CAPACITY_BALANCING)} only: change {F('moe_router_load_balancing_type')}"
            )
    if a.get("moe_pad_expert_input_to_capacity") and (capacity is None or capacity < 0):
        errors.append(
            f"{F('moe_pad_expert_input_to_capacity')} needs --moe-expert-capacity-factor: set a capacity or drop it"
        )
    return errors


def _dispatcher_checks(a: _Args, ep: int, etp: int) -> list[str]:
    """TransformerConfig.__post_init__ on the flex dispatcher; MoEFlexTokenDispatcher.__init__."""
    errors, F = [], a.flag
    dispatcher = a.get("moe_token_dispatcher_type", "allgather")
    backend = a.get("moe_flex_dispatcher_backend", "deepep")
    if dispatcher != "flex":
        errors += [
            f"{F(d)} needs --moe-token-dispatcher-type flex: set it or drop {F(d)}"
            for d in ("moe_enable_deepep", "moe_flex_dispatcher_backend")
            if a.has(d) and a.get(d)
        ]
        return errors
    if a.get("moe_enable_deepep"):
        backend = "deepep"
    if backend in ("deepep", "ncclep") and etp * ep == 1:
        # "DeepEP dispatcher requires TPxEP > 1" (its expert-TP x EP group)
        errors.append(
            f"the flex dispatcher ({backend}) sends tokens over the expert-TP x EP group, here 1 rank "
            f"({F('expert_tensor_parallel_size')} {etp}, {F('expert_model_parallel_size')} {ep}): use "
            "--moe-token-dispatcher-type alltoall or expert parallelism"
        )
    if backend == "deepep" and a.get("moe_pad_expert_input_to_capacity"):
        errors.append(
            f"DeepEP does not pad to capacity: drop {F('moe_pad_expert_input_to_capacity')} or use "
            "--moe-token-dispatcher-type alltoall"
        )
    return errors


def _ep_overlap_checks(a: _Args, ep: int, pp: int) -> list[str]:
    """TransformerConfig.__post_init__'s overlap_moe_expert_parallel_comm block: the dispatch and
    combine all-to-alls of one micro-batch hide behind another's compute."""
    F = a.flag
    flag = F("overlap_moe_expert_parallel_comm")
    needs = []
    if ep <= 1:
        needs.append("--expert-model-parallel-size > 1")
    if a.get("moe_token_dispatcher_type", "allgather") not in ("alltoall", "flex"):
        needs.append("--moe-token-dispatcher-type alltoall or flex")
    if pp > 1 and not _interleaved(a, pp):
        needs.append("the interleaved schedule (virtual pipeline stages) with a pipeline")
    if a.get("recompute_granularity") == "full" or a.get("recompute_method") or a.get("recompute_num_layers"):
        needs.append("no full recomputation (--recompute-granularity/method/num-layers)")
    if "moe" in (a.get("recompute_modules") or []):
        needs.append("no 'moe' in --recompute-modules")
    if not (a.get("bf16") or a.get("fp16")):
        needs.append("--bf16 or --fp16")
    if a.get("moe_shared_expert_overlap"):
        needs.append("no --moe-shared-expert-overlap")
    if (a.get("mtp_num_layers") or 0) > 1:
        needs.append("at most one MTP layer (--mtp-num-layers)")
    return [f"{flag} needs {n}: provide it or drop {flag}" for n in needs]


def _interleaved(a: _Args, pp: int) -> bool:
    """Whether the flags ask for more than one virtual stage per rank (validate_args)."""
    layout = a.get("pipeline_model_parallel_layout")
    if layout is not None:
        return len(_layout_stages(layout) or []) > pp
    if (a.get("num_virtual_stages_per_pipeline_rank") or 1) > 1:
        return True
    num_layers = a.get("num_layers")
    return num_layers is not None and _virtual_pipeline_degree(a, num_layers, pp)[0] is not None


# --------------------------------------------------------------------------- MLA, windows, activations


# MLA's shape flags: read by MLATransformerConfig only.
_MLA_DESTS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")


def _mla_checks(a: _Args) -> list[str]:
    """validate_args and (MLA)TransformerConfig.__post_init__ on multi-latent attention."""
    F = a.flag
    if not a.get("multi_latent_attention"):
        return [
            f"{F(d)} has no effect without --multi-latent-attention: add it or drop {F(d)}"
            for d in _MLA_DESTS
            if a.has(d)
        ]
    errors = []
    if a.get("group_query_attention"):
        errors.append(
            "--multi-latent-attention and --group-query-attention are mutually exclusive (every MLA head "
            "has its own key and value from the latent): drop --group-query-attention"
        )
    if a.get("rotary_interleaved"):
        errors.append("--rotary-interleaved does not work with --multi-latent-attention: drop it")
    if a.get("apply_rope_fusion", True) and a.get("rope_type") not in (None, "yarn"):
        errors.append(
            f"{F('rope_type')} {a.get('rope_type')} with --multi-latent-attention needs --no-rope-fusion "
            "(MLA's fused RoPE is YaRN's): add --no-rope-fusion or drop --rope-type"
        )
    for dest in _MLA_DESTS:
        value = a.get(dest)
        if value is not None and value <= 0:
            errors.append(f"{F(dest)} {value} must be positive")
    return errors


def _window_checks(a: _Args) -> list[str]:
    """Sliding-window attention: --window-size (left, right) on the layers --window-attn-skip-freq
    does not skip (core/transformer/utils.py is_layer_window_attention)."""
    F = a.flag
    window, skip = a.get("window_size"), a.get("window_attn_skip_freq")
    if window is None:
        if skip is not None:
            return [f"{F('window_attn_skip_freq')} has no effect without --window-size: add it or drop the flag"]
        return []
    errors = []
    if len(window) != 2 or min(window) < -1:
        errors.append(
            f"{F('window_size')} takes the window's left and right extent (-1: unbounded), e.g. 127,0; "
            f"got {','.join(map(str, window))}"
        )
    num_layers = a.get("num_layers")
    if isinstance(skip, int) and skip < 1:
        errors.append(f"{F('window_attn_skip_freq')} {skip} must be at least 1 (every freq-th layer is full)")
    elif isinstance(skip, list) and num_layers is not None and len(skip) != num_layers:
        errors.append(
            f"{F('window_attn_skip_freq')} lists {len(skip)} layers but {F('num_layers')} is {num_layers}: "
            "give one entry per layer"
        )
    return errors


def _dense_mlp(a: _Args) -> bool:
    """Whether the model has a dense MLP: no experts, dense layers among them, or shared experts."""
    freq = a.get("moe_layer_freq", 1)
    return (
        not a.get("num_experts")
        or (isinstance(freq, int) and freq > 1)
        or (isinstance(freq, list) and 0 in freq)
        or a.get("moe_shared_expert_intermediate_size") is not None
    )


def _activation_checks(a: _Args) -> list[str]:
    """argument_utils.core_transformer_config_from_args and TransformerConfig.__post_init__ on the
    activation; MLP.forward's fused bias-activation path."""
    F = a.flag
    swiglu, quick = a.get("swiglu"), a.get("quick_geglu")
    if swiglu and quick:
        return ["--swiglu and --quick-geglu are two activations: keep one"]
    fusion = a.get("bias_swiglu_fusion", True) if swiglu else a.get("bias_gelu_fusion", True)
    clamp, offset = a.get("activation_func_clamp_value"), a.get("glu_linear_offset", 0.0)
    errors = []
    if swiglu and clamp is not None:
        if not math.isfinite(clamp) or clamp <= 0:
            errors.append(f"{F('activation_func_clamp_value')} {clamp} must be finite and positive")
        if not a.get("num_experts"):
            errors.append(f"{F('activation_func_clamp_value')} with --swiglu is for MoE models only (--num-experts)")
        if offset:
            errors.append(f"{F('glu_linear_offset')} must be 0 when --swiglu is clamped")
    if offset and fusion and not quick:
        errors.append(
            f"{F('glu_linear_offset')} {offset} needs --quick-geglu with the fused bias-activation kernel: "
            "use --quick-geglu or add --no-bias-swiglu-fusion/--no-bias-gelu-fusion"
        )
    if quick and fusion and _dense_mlp(a):
        errors.append(
            "--quick-geglu in a dense MLP (or shared experts) needs --no-bias-gelu-fusion: Megatron-Core fuses "
            "only gelu and swiglu there"
        )
    return errors


# --------------------------------------------------------------------------- entry point


def check_megatron_args(flags: list[tuple[str, str | None]], world_size: int) -> list[str]:
    """Errors for a Megatron-LM flag list (as from ``parse_args_lines``); empty means valid."""
    index = _by_option()
    errors: list[str] = []
    values: dict[str, Any] = {}
    given: dict[str, str] = {}
    value_errors = False
    for flag, value in flags:
        rec = index.get(flag)
        if rec is None:
            close = difflib.get_close_matches(flag, index.keys(), n=1, cutoff=0.6)
            hint = f": did you mean {close[0]}?" if close else ": remove it"
            errors.append(
                f"unknown flag {flag}: not an argument of Megatron-LM (megatron-core {megatron_version()}){hint}"
            )
            continue
        dest = rec["dest"]
        if dest in given and rec["action"] not in ("append", "append_const", "count"):
            # argparse would keep the last one silently; two values for one setting is a bug.
            same = given[dest] == flag
            errors.append(
                f"{flag} given more than once"
                if same
                else f"{flag} and {given[dest]} set the same option ({dest}): keep one"
            )
            continue
        given[dest] = flag
        flag_errors, parsed = _check_one(flag, value, rec)
        errors += flag_errors
        if not flag_errors and parsed is not None:
            values[dest] = parsed
        value_errors = value_errors or bool(flag_errors)
    # The cross-checks need every value; with a malformed one they would run on Megatron's
    # default instead and report follow-up noise, so fix the per-flag errors first.
    if not value_errors:
        errors += _cross_checks(_Args(values, given), world_size)
    return errors


def check_pretrain_needs(flags: list[tuple[str, str | None]]) -> list[str]:
    """What `pretrain_gpt.py` needs beyond valid flags before it trains, found by running Megatron-LM's
    own code on planned files (scripts/check_megatron_lm.py, Megatron-LM main d98e8a6): each missing
    item parses and validates, then fails at start-up."""
    given = {flag for flag, _ in flags}
    errors = []
    if "--tokenizer-type" not in given:
        # validate_args defaults to GPT2BPETokenizer, which downloads GPT-2's vocabulary and ignores --vocab-size.
        errors.append(
            "no --tokenizer-type: Megatron-LM falls back to GPT2BPETokenizer (a download) and ignores "
            "--vocab-size; name the tokenizer (NullTokenizer for mock or pre-tokenized data)"
        )
    if not given & {"--train-iters", "--train-samples"}:
        errors.append(
            "no --train-iters: pretrain() stops with 'either train-iters or train-samples should be provided'"
        )
    if "--eval-interval" not in given:
        errors.append("no --eval-interval: get_train_valid_test_num_samples divides by it (its default is None)")
    if not given & {"--mock-data", "--data-path", "--train-data-path"}:
        errors.append(
            "no data: give --data-path (and --split) or --mock-data; without either GPTDataset fails to build"
        )
    if "--exit-signal-handler" in given and "--save" not in given:
        errors.append("--exit-signal-handler without --save exits on the signal without a checkpoint")
    values = dict(flags)
    tp = values.get("--tensor-model-parallel-size") or "1"
    if "--num-experts" in given and tp.isdigit() and int(tp) > 1 and "--sequence-parallel" not in given:
        # MoELayer.forward raises in training: "performance may degrade if MoE and tensor
        # parallelism are enabled without also enabling sequence parallelism".
        errors.append(
            f"a MoE model with --tensor-model-parallel-size {tp} needs --sequence-parallel: Megatron-Core's MoE "
            "layer refuses to train with tensor parallelism without it"
        )
    return errors


__all__ = [
    "check_megatron_args",
    "check_pretrain_needs",
    "parse_args_lines",
    "load_table",
    "megatron_version",
    "known_flags",
]
