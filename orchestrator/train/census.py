"""What a rank really holds of the model state, tensor by tensor (``--memory-census DIR``).

The cost model predicts per-GPU bytes of weights, gradients and optimizer state
(costmodel/memory.py). This counts them in a live DeepSpeed engine: every tensor reachable from
the model's parameters and from the optimizer DeepSpeed built (its wrappers' attributes, the torch
optimizer's state and parameter groups), each storage once, so that a view of a flat buffer is not
counted twice. What is counted where:

* **params**: the module's parameters as they are stored on this rank (under ZeRO-3, the
  partition ``ds_tensor``; the module's own ``.data`` is then an empty placeholder).
* **optimizer**: the tensors of the inner torch optimizer's ``state`` (Adam's moments) and the
  parameters it steps when they are not the module's (the fp32 master copies of mixed precision).
* **grads**: the ``.grad`` of the module's parameters and of those master copies.
* **other**: every other tensor the optimizer wrappers hold: gradient accumulation and reduce
  buffers, flat copies. Which these are is the engines' business (stage_1_and_2.py,
  bf16_optimizer.py, stage3.py); the cost model counts the fp32 gradient buffer of bf16 with the
  gradients and the reduce buckets as communication buffers.

Run after the first optimizer step, when every lazily built state exists.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

_SKIP_TYPES = (torch.nn.Module,)


def _storage(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def _walk(obj, seen_objs: set[int], out: list[torch.Tensor], depth: int = 0) -> None:
    """Tensors reachable from ``obj`` through attributes, lists, tuples and dicts (not modules:
    the model is counted from its parameters)."""
    if depth > 8 or id(obj) in seen_objs:
        return
    seen_objs.add(id(obj))
    if isinstance(obj, torch.Tensor):
        out.append(obj)
        if obj.grad is not None:
            out.append(obj.grad)
        ds = getattr(obj, "ds_tensor", None)
        if isinstance(ds, torch.Tensor):
            out.append(ds)
        return
    if isinstance(obj, _SKIP_TYPES) or isinstance(obj, (str, bytes, int, float, bool, type(None))):
        return
    if isinstance(obj, dict):
        for v in list(obj.values()):
            _walk(v, seen_objs, out, depth + 1)
        return
    if isinstance(obj, (list, tuple, set)):
        for v in list(obj):
            _walk(v, seen_objs, out, depth + 1)
        return
    module = type(obj).__module__ or ""
    if module.startswith(("deepspeed", "torch.optim")) and hasattr(obj, "__dict__"):
        for v in list(vars(obj).values()):
            _walk(v, seen_objs, out, depth + 1)


def census(engine) -> dict[str, int]:
    """Bytes of params, grads, optimizer and other model-state tensors on this rank."""
    counted: dict[int, str] = {}
    sizes: dict[int, int] = {}

    def add(t: torch.Tensor | None, kind: str) -> None:
        if t is None or t.numel() == 0 or t.device.type == "meta":
            return
        ptr, n = _storage(t)
        if ptr and ptr not in counted:
            counted[ptr], sizes[ptr] = kind, n

    module_params = list(engine.module.parameters())
    for p in module_params:
        ds = getattr(p, "ds_tensor", None)
        add(ds if isinstance(ds, torch.Tensor) else p.data, "params")
    inner = engine.optimizer
    while hasattr(inner, "optimizer") and not isinstance(inner, torch.optim.Optimizer):
        inner = inner.optimizer
    module_ptrs = {_storage(p.data)[0] for p in module_params if p.numel()}
    if isinstance(inner, torch.optim.Optimizer):
        for state in inner.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor) and v.numel() > 1:  # not Adam's step counter
                    add(v, "optimizer")
        for group in inner.param_groups:
            for p in group["params"]:
                if _storage(p.data)[0] not in module_ptrs:
                    add(p.data, "optimizer")
                add(p.grad, "grads")
    for p in module_params:
        add(p.grad, "grads")
    found: list[torch.Tensor] = []
    _walk(engine.optimizer, set(), found)
    for t in found:
        add(t, "other")
    out = {"params": 0, "grads": 0, "optimizer": 0, "other": 0}
    for ptr, kind in counted.items():
        out[kind] += sizes[ptr]
    return out


def census_before_second_step(engine, directory: Path, rank: int, stage: int) -> None:
    """Count when the model state is at its fullest: in the second optimizer step, before it
    updates (the gradients of the whole batch are there, and the optimizer states the first step
    created lazily). The engine's optimizer step is wrapped once for this."""
    opt = engine.optimizer
    original = opt.step
    calls = [0]

    def step(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 2:
            directory.mkdir(parents=True, exist_ok=True)
            doc = {"rank": rank, "stage": stage, "bytes": census(engine)}
            (directory / f"census-rank{rank}.json").write_text(json.dumps(doc) + "\n")
        return original(*args, **kwargs)

    opt.step = step
