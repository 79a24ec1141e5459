"""The model's full weights as one process would hold them, from any layout (``--dump-weights``).

Each rank joins its tensor-parallel shards over the tp group (``tp_split``, set by the parallel
layers of train/model/tensor_parallel.py: the dimension and the fused blocks), names its routed experts
by their global index (rank r of an expert group of ep holds experts r E/ep ..), and names every
parameter as the pp = 1 model does (``layers.<i>.``; reshard.py's naming). What one rank writes is
the part of the model its stage holds, whole; the union over the ranks is the model, and a name
written by several ranks (data-parallel replicas, tp peers) must carry the same tensor. The
equivalence tests compare these against a single-process run (tests/system/test_moe.py). ZeRO-3
partitions the weights themselves and is not gathered here.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
import torch.distributed as dist

from orchestrator.train.checkpoint.reshard import dense_name
from orchestrator.train.model.moe import MoEFeedForward

_EXPERT = re.compile(r"^(.*\.deepspeed_experts\.)(\d+)(\..*)$")


def _join_tp(p: torch.Tensor, group) -> torch.Tensor:
    """The full tensor of tp shard ``p`` (a copy; ``p`` itself when it is not sharded)."""
    split = getattr(p, "tp_split", None)
    n = 1 if group is None else dist.get_world_size(group)
    if split is None or n == 1:
        return p.detach().clone()
    shards = [torch.empty_like(p) for _ in range(n)]
    dist.all_gather(shards, p.detach().contiguous(), group=group)
    return join_blocks(shards, *split)


def join_blocks(shards: list[torch.Tensor], dim: int, parts: list[int]) -> torch.Tensor:
    """The full tensor of the tp ranks' ``shards`` (in rank order), split along ``dim`` as the full
    blocks of sizes ``parts`` are (tensor_parallel.mark_tensor_parallel)."""
    n = len(shards)
    # Each shard is [block_0 / n; block_1 / n; ...] along dim; the full tensor is block by block.
    pieces = [s.split([size // n for size in parts], dim=dim) for s in shards]
    return torch.cat([torch.cat([pc[i] for pc in pieces], dim=dim) for i in range(len(parts))], dim=dim)


def full_weights(module: torch.nn.Module, tp_group) -> dict[str, torch.Tensor]:
    """This rank's part of the model, every tensor whole, by its single-process name (fp32)."""
    first_expert: dict[str, int] = {}  # module path of a MoE layer -> global index of its first local expert
    for path, m in module.named_modules():
        if isinstance(m, MoEFeedForward):
            first_expert[path + "."] = m.ep.rank * m.num_local_experts
    out = {}
    for name, p in module.named_parameters():
        full = _join_tp(p, tp_group).float()
        m = _EXPERT.match(name)
        if m:
            prefix = next(k for k in first_expert if name.startswith(k))
            name = f"{m.group(1)}{first_expert[prefix] + int(m.group(2))}{m.group(3)}"
        out[dense_name(name)] = full
    return out


def dump_weights(module: torch.nn.Module, tp_group, directory: Path, rank: int) -> None:
    if any(hasattr(p, "ds_id") for p in module.parameters()):
        raise SystemExit("--dump-weights: ZeRO-3 partitions the weights themselves; gather them with DeepSpeed")
    directory.mkdir(parents=True, exist_ok=True)
    torch.save(full_weights(module, tp_group), directory / f"weights-rank{rank}.pt")


def dump_logits(engine, plan, grid, device, directory: Path, step: int) -> None:
    """One forward (no gradient) of a fixed batch, ids drawn from seed 0: micro-batch x seq_length
    tokens; the last stage's logits, joined over the tp group, to ``directory``/logits-step``step``.pt as
    {"ids": [b, s], "logits": [b, s, vocab]} (fp32), written by its tp and dp rank 0."""
    lay, model = plan.layout, plan.spec.model
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.vocab_size, (lay.micro_batch_size, plan.spec.training.seq_length), generator=g)
    batch = (ids.to(device), ids.to(device))
    if lay.pp > 1:
        _, logits = engine.eval_batch(iter([batch]), return_logits=True, num_micro_batches=1)
        if not engine.is_last_stage():
            return
    else:
        with torch.no_grad():
            logits = engine.module.logits(batch[0])
    group = grid.get_slice_parallel_group()
    n = dist.get_world_size(group)
    shards = [torch.empty_like(logits) for _ in range(n)]
    dist.all_gather(shards, logits.contiguous(), group=group)
    full = torch.cat(shards, dim=-1).transpose(0, 1).float().cpu()  # [s, b, V/tp] x tp -> [b, s, V]
    if grid.get_slice_parallel_rank() == 0 and grid.get_data_parallel_rank() == 0:
        directory.mkdir(parents=True, exist_ok=True)
        torch.save({"ids": ids, "logits": full}, directory / f"logits-step{step}.pt")
