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
* **expert_params**, **expert_optimizer**: the part of params and optimizer that belongs to the
  routed experts of MoE layers (train/model/moe.py; also counted above). Expert weights are named
  ``...deepspeed_experts.<i>...``; their optimizer state is that of the optimizer's MoE parameter
  groups (DeepSpeed splits them off at ep > 1, moe/utils.py, and shards them over the expert
  data-parallel group); at ep = 1 the experts share the dense groups and expert_optimizer is 0.

Run after the first optimizer step, when every lazily built state exists.

``saved_activations`` counts the other side of a rank's memory: the tensors one forward of a
module leaves for its backward, against the cost model's ``activation_bytes_per_layer``
(tests/system/test_activation_census.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
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
    """Bytes of params, grads, optimizer and other model-state tensors on this rank, and the
    routed experts' share of params and optimizer."""
    counted: dict[int, str] = {}
    sizes: dict[int, int] = {}
    experts: set[int] = set()  # storages of expert weights and of their optimizer state

    def add(t: torch.Tensor | None, kind: str, expert: bool = False) -> None:
        if t is None or t.numel() == 0 or t.device.type == "meta":
            return
        ptr, n = _storage(t)
        if ptr and ptr not in counted:
            counted[ptr], sizes[ptr] = kind, n
            if expert:
                experts.add(ptr)

    named = list(engine.module.named_parameters())
    module_params = [p for _, p in named]
    for name, p in named:
        ds = getattr(p, "ds_tensor", None)
        add(ds if isinstance(ds, torch.Tensor) else p.data, "params", ".deepspeed_experts." in name)
    inner = engine.optimizer
    while hasattr(inner, "optimizer") and not isinstance(inner, torch.optim.Optimizer):
        inner = inner.optimizer
    module_ptrs = {_storage(p.data)[0] for p in module_params if p.numel()}
    if isinstance(inner, torch.optim.Optimizer):
        for group in inner.param_groups:
            moe = bool(group.get("moe"))  # DeepSpeed's mark of an expert group (moe/utils.py)
            for p in group["params"]:
                for v in inner.state.get(p, {}).values():
                    if isinstance(v, torch.Tensor) and v.numel() > 1:  # not Adam's step counter
                        add(v, "optimizer", moe)
                if _storage(p.data)[0] not in module_ptrs:
                    add(p.data, "optimizer", moe)
                add(p.grad, "grads")
    for p in module_params:
        add(p.grad, "grads")
    found: list[torch.Tensor] = []
    _walk(engine.optimizer, set(), found)
    for t in found:
        add(t, "other")
    out = {"params": 0, "grads": 0, "optimizer": 0, "other": 0, "expert_params": 0, "expert_optimizer": 0}
    for ptr, kind in counted.items():
        out[kind] += sizes[ptr]
        if ptr in experts:
            out[f"expert_{kind}"] += sizes[ptr]
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


# --------------------------------------------------------------------------- activations


@dataclass(frozen=True)
class SavedStorage:
    """One storage autograd keeps from a forward until its backward.

    ``shape`` is that of the first tensor saved from it (a view's own shape); ``base_shape`` that of
    the tensor owning the storage when the saved one is a view, since a view keeps all of it alive.
    ``producer`` is the autograd node that made the storage's owner (``ToCopyBackward0`` for a
    ``.float()`` copy, ``SiluBackward0`` for silu's output); ``leaf`` for an input that requires
    grad, ``constant`` for a tensor outside the graph (attention's log-sum-exp, a non-differentiable
    output; a buffer cast to another dtype)."""

    shape: tuple[int, ...]
    base_shape: tuple[int, ...] | None
    dtype: torch.dtype
    nbytes: int
    producer: str


@dataclass(frozen=True)
class SavedActivations:
    """What one forward left for its backward, storage by storage, in the order autograd saved them."""

    storages: tuple[SavedStorage, ...]

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.storages)

    def table(self) -> str:
        """One row per storage (bytes, dtype, shape, the tensor it is a view of, producer), then the total."""
        rows = [
            f"{s.nbytes:>10,}  {str(s.dtype).removeprefix('torch.'):<9} {str(list(s.shape)):<18} "
            f"{'view of ' + str(list(s.base_shape)) if s.base_shape else '':<24} {s.producer}"
            for s in self.storages
        ]
        return "\n".join([*rows, f"{self.nbytes:>10,}  total"])


def _producer(t: torch.Tensor) -> str:
    owner = t._base if t._base is not None else t
    if owner.grad_fn is not None:
        return type(owner.grad_fn).__name__
    return "leaf" if owner.requires_grad else "constant"


def saved_activations(module: torch.nn.Module, *args, **kwargs):
    """Run ``module(*args, **kwargs)`` once and count the tensors autograd saved for its backward.

    Returns ``(output, SavedActivations)``; the output carries the graph (call backward on it or drop
    it). Every tensor an op saves passes through the pack hook of the innermost
    ``torch.autograd.graph.saved_tensors_hooks`` (PyTorch docs, "Hooks for saved tensors"), so:

    * each storage is counted once, by ``untyped_storage().data_ptr()``: an op saving a view keeps
      the whole storage alive, and two ops saving the same tensor (or two views of it) keep it once;
    * the module's parameters and buffers are left out: weights are model state (``census`` above),
      and constant tables (RoPE's cos/sin) do not grow with the micro-batch;
    * under non-reentrant activation checkpointing (torch.utils.checkpoint, use_reentrant=False) the
      ops inside a checkpointed region save into checkpoint's own hooks, which keep a placeholder and
      recompute the tensor in backward; what the region keeps is its inputs, which checkpoint saves
      as saved tensors before installing its hooks (``_CheckpointFrame.save_inputs``), and so they
      come through here. The CPU/GPU RNG states checkpoint stashes to replay dropout are plain
      attributes of its frame, not saved tensors, and are not counted (a few KiB per region,
      independent of the micro-batch).
    """
    skip = {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()]}
    found: dict[int, SavedStorage] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr and ptr not in skip and ptr not in found:
            found[ptr] = SavedStorage(
                tuple(t.shape),
                tuple(t._base.shape) if t._base is not None else None,
                t.dtype,
                storage.nbytes(),
                _producer(t),
            )
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(*args, **kwargs)
    return out, SavedActivations(tuple(found.values()))
