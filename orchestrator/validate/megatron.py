"""Validate emitted Megatron-LM launch flags against Megatron-LM's real argument table.

The table (``megatron_args.json``, read by ``megatron_table.py``) is generated from the pinned
megatron-core wheel by ``scripts/refresh_megatron_args.py``; see its header for the version and sha256.

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

This module is the entry point; the checks live by family beside it: ``megatron_table.py`` (the
table, ``Args``), ``megatron_flags.py`` (parsing, layer 1), and for layer 2 ``megatron_parallel.py``
(sizes, batch, sequence, pipeline split), ``megatron_training.py`` (deprecated flags, precision,
recomputation, Megatron-FSDP), ``megatron_model.py`` (required sizes, attention, MLA, windows,
activation) and ``megatron_moe.py`` (experts, router, dispatcher).
"""

from __future__ import annotations

import difflib
from typing import Any

from orchestrator.validate.megatron_flags import check_one, parse_args_lines
from orchestrator.validate.megatron_model import (
    activation_checks,
    attention_checks,
    mla_checks,
    required_model_size_checks,
    window_checks,
)
from orchestrator.validate.megatron_moe import moe_checks
from orchestrator.validate.megatron_parallel import (
    batch_size_checks,
    pipeline_checks,
    seq_length_checks,
    world_size_checks,
)
from orchestrator.validate.megatron_table import Args, by_option, known_flags, load_table, megatron_version
from orchestrator.validate.megatron_training import (
    deprecated_flag_checks,
    megatron_fsdp_checks,
    precision_and_recompute_checks,
)


def _cross_checks(a: Args, world_size: int) -> list[str]:
    tp = a.get("tensor_model_parallel_size", 1)
    pp = a.get("pipeline_model_parallel_size", 1)
    cp = a.get("context_parallel_size", 1)
    errors = deprecated_flag_checks(a)
    # Megatron-LM's parser takes any int here and validate_args divides by them: 0 would end
    # there in a ZeroDivisionError, a negative size in a nonsense model-parallel size.
    degrees = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp, "context_parallel_size": cp}
    bad = [f"{a.flag(k)} {v} must be at least 1" for k, v in degrees.items() if v < 1]
    if bad:
        return errors + bad
    size_errors, dp = world_size_checks(a, world_size, tp, pp, cp)
    errors += size_errors
    errors += batch_size_checks(a, dp)
    errors += required_model_size_checks(a)
    errors += seq_length_checks(a, cp)
    errors += pipeline_checks(a, pp)
    errors += attention_checks(a, tp)
    errors += precision_and_recompute_checks(a, tp)
    errors += megatron_fsdp_checks(a)
    errors += moe_checks(a, world_size, tp, pp)
    errors += mla_checks(a)
    errors += window_checks(a)
    errors += activation_checks(a)
    return errors


def check_megatron_args(flags: list[tuple[str, str | None]], world_size: int) -> list[str]:
    """Errors for a Megatron-LM flag list (as from ``parse_args_lines``); empty means valid."""
    index = by_option()
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
        flag_errors, parsed = check_one(flag, value, rec)
        errors += flag_errors
        if not flag_errors and parsed is not None:
            values[dest] = parsed
        value_errors = value_errors or bool(flag_errors)
    # The cross-checks need every value; with a malformed one they would run on Megatron's
    # default instead and report follow-up noise, so fix the per-flag errors first.
    if not value_errors:
        errors += _cross_checks(Args(values, given), world_size)
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
