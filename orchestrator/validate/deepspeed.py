"""Validate a ds_config.json with DeepSpeed's own config classes, plus what DeepSpeed accepts silently.

``DeepSpeedConfig`` reads the data-parallel world size from torch.distributed: it calls
``deepspeed.comm.get_rank()`` and, when that fails (no process group, as when planning on a login
node), silently assumes a world size of 1, so the batch check ``train_batch_size ==
micro_batch * grad_accum * world_size`` would test the wrong product. We therefore supply the
size explicitly through DeepSpeed's documented ``mpu`` interface (an object with
``get_data_parallel_world_size()``, what Megatron's mpu provides) and, for the duration of the
call only, a ``get_rank()`` that answers 0 instead of needing a process group.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

# Top-level keys DeepSpeed 0.19 reads (deepspeed/runtime/config.py and the sub-config modules it
# calls; https://www.deepspeed.ai/docs/config-json/). DeepSpeed ignores any other top-level key
# without a word, so a typo such as "zero_optimisation" would silently disable ZeRO.
KNOWN_TOP_LEVEL_KEYS = frozenset(
    {
        "activation_checkpointing",
        "aio",
        "amp",
        "autotuning",
        "bf16",
        "bfloat16",
        "checkpoint",
        "comet",
        "comms_logger",
        "communication_data_type",
        "compile",
        "compression_training",
        "csv_monitor",
        "curriculum_learning",
        "data_efficiency",
        "data_types",
        "dataloader_drop_last",
        "datastates",
        "disable_allgather",
        "disable_python_gc",
        "dump_state",
        "eigenvalue",
        "elasticity",
        "expert_parallel",
        "flops_profiler",
        "fp16",
        "gradient_accumulation_steps",
        "gradient_allreduce_op",
        "gradient_clipping",
        "gradient_predivide_factor",
        "hybrid_engine",
        "log_level",
        "managed_gradient_accumulation",
        "memory_breakdown",
        "nebula",
        "optimizer",
        "pipeline",
        "prescale_gradients",
        "progressive_layer_drop",
        "quantize_training",
        "scheduler",
        "seq_parallel_communication_data_type",
        "sequence_parallel_size",
        "sparse_attention",
        "sparse_gradients",
        "steps_per_print",
        "tensor_parallel",
        "tensorboard",
        "timers",
        "torch_autocast",
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "use_data_before_expert_parallelism",
        "vocabulary_size",
        "wall_clock_breakdown",
        "wandb",
        "weight_quantization",
        "zero_allow_untested_optimizer",
        "zero_force_ds_cpu_optimizer",
        "zero_optimization",
    }
)

# Optimizer types DeepSpeed builds itself (deepspeed/runtime/config.py DEEPSPEED_OPTIMIZERS) plus
# the torch.optim names its engine resolves.
KNOWN_OPTIMIZERS = frozenset(
    {
        "adagrad",
        "adam",
        "adamw",
        "lamb",
        "onebitadam",
        "zerooneadam",
        "onebitlamb",
        "muadam",
        "muadamw",
        "musgd",
        "lion",
        "muon",
        "sgd",
    }
)

KNOWN_SCHEDULERS = frozenset({"LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"})


class _DataParallelMPU:
    """DeepSpeed's mpu protocol, reduced to what DeepSpeedConfig asks: the data-parallel size."""

    def __init__(self, dp: int) -> None:
        self._dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self._dp


class _RankZero:
    @staticmethod
    def get_rank(group=None) -> int:
        return 0


@contextlib.contextmanager
def _without_process_group():
    import deepspeed.runtime.config as ds_config_module

    real = ds_config_module.dist
    ds_logger = logging.getLogger("DeepSpeed")
    level = ds_logger.level
    ds_config_module.dist = _RankZero
    ds_logger.setLevel(logging.WARNING)
    try:
        yield ds_config_module.DeepSpeedConfig
    finally:
        ds_config_module.dist = real
        ds_logger.setLevel(level)


def _string_numbers(node: Any, path: str, out: list[str]) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            _string_numbers(v, f"{path}.{k}" if path else k, out)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _string_numbers(v, f"{path}[{i}]", out)
    elif isinstance(node, str) and node != "auto":
        try:
            float(node)
        except ValueError:
            return
        out.append(
            f"'{path}' is the string {node!r}; write the number without quotes "
            f"(DeepSpeed compares some of these as strings and skips its checks)"
        )


def dsorch_checks(cfg: dict) -> list[str]:
    """What DeepSpeed accepts silently but is almost certainly a mistake."""
    errors: list[str] = []
    import difflib

    for key in cfg:
        if key not in KNOWN_TOP_LEVEL_KEYS:
            close = difflib.get_close_matches(key, sorted(KNOWN_TOP_LEVEL_KEYS), n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            errors.append(
                f"unknown top-level key '{key}', which DeepSpeed ignores without a warning; {hint}remove or rename it"
            )
    opt = cfg.get("optimizer")
    if isinstance(opt, dict) and "type" in opt and str(opt["type"]).lower() not in KNOWN_OPTIMIZERS:
        errors.append(
            f"optimizer.type '{opt['type']}' is not an optimizer DeepSpeed knows; use one of "
            f"AdamW, Adam, Lamb, Lion, SGD, Adagrad (or pass a client optimizer in code)"
        )
    sched = cfg.get("scheduler")
    if isinstance(sched, dict) and "type" in sched and sched["type"] not in KNOWN_SCHEDULERS:
        errors.append(
            f"scheduler.type '{sched['type']}' is not a DeepSpeed scheduler; use one of "
            f"{', '.join(sorted(KNOWN_SCHEDULERS))}"
        )
    _string_numbers(cfg, "", errors)
    return errors


def validate_ds_config(cfg: dict, dp: int) -> list[str]:
    """Errors (empty when valid) of a ds_config dict for a data-parallel size ``dp``."""
    errors = dsorch_checks(cfg)
    with _without_process_group() as DeepSpeedConfig:
        try:
            DeepSpeedConfig(cfg, mpu=_DataParallelMPU(dp))
        except Exception as e:  # DeepSpeed raises AssertionError, ValueError, pydantic errors...
            msg = " ".join(str(e).split())
            errors.insert(0, f"DeepSpeed's DeepSpeedConfig rejects it at data-parallel size {dp}: {msg}")
    return errors
