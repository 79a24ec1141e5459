"""Megatron-style tensor parallelism over a torch.distributed process group.

The four communication operators are the ``f``/``g`` conjugate pairs of Megatron-LM
(Shoeybi et al. 2019, "Megatron-LM", Sec. 3, Fig. 3) and their sequence-parallel variants
(Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
Sec. 4.2.2, Fig. 5), as in megatron/core/tensor_parallel/mappings.py:

    copy_to_tp            forward identity             backward all-reduce
    reduce_from_tp        forward all-reduce           backward identity
    gather_from_sp        forward all-gather (seq)     backward reduce-scatter (seq)
    gather_replicated     forward all-gather (seq)     backward split (seq)
    reduce_scatter_to_sp  forward reduce-scatter (seq) backward all-gather (seq)
    scatter_to_sp         forward split (seq)          backward all-gather (seq)

Activations are laid out [sequence, batch, hidden] as in Megatron, so a sequence shard is a
contiguous slice of dim 0.

Weights are initialised *full* from a generator seeded by (seed, name) and then sliced, so a
model has the same full weights for every tp degree: that is what lets the equivalence tests
compare a tp=2 run with a single-process run.
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

# --------------------------------------------------------------------------- collectives


def _world(group) -> int:
    return 1 if group is None else dist.get_world_size(group)


def _all_gather_dim0(x: torch.Tensor, group) -> torch.Tensor:
    n = _world(group)
    if n == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(n)]
    # List-based all_gather: the tensor variant (all_gather_into_tensor) is missing on gloo.
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=0)


def _reduce_scatter_dim0(x: torch.Tensor, group) -> torch.Tensor:
    n = _world(group)
    if n == 1:
        return x
    x = x.contiguous()
    if dist.get_backend(group) == "nccl":
        out = torch.empty((x.shape[0] // n, *x.shape[1:]), dtype=x.dtype, device=x.device)
        dist.reduce_scatter_tensor(out, x, group=group)
        return out
    # gloo has no reduce_scatter: all-reduce then keep our slice (same result, 2x the traffic). A
    # copy, as NCCL's output is its own tensor: a view would keep the whole sum alive wherever the
    # slice is saved for backward (the MoE shared-expert gate's product, tests/system/test_activation_census.py).
    dist.all_reduce(x, group=group)
    return x.chunk(n, dim=0)[dist.get_rank(group)].clone()


def _split_dim0(x: torch.Tensor, group) -> torch.Tensor:
    n = _world(group)
    if n == 1:
        return x
    return x.chunk(n, dim=0)[dist.get_rank(group)].contiguous()


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        if _world(ctx.group) > 1:
            g = g.contiguous()
            dist.all_reduce(g, group=ctx.group)
        return g, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        if _world(group) > 1:
            x = x.contiguous()
            dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GatherFromSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather_dim0(x, group)

    @staticmethod
    def backward(ctx, g):
        # The consumer is a column-parallel GEMM: each rank's gradient is a partial sum.
        return _reduce_scatter_dim0(g, ctx.group), None


class _GatherReplicated(torch.autograd.Function):
    """All-gather the sequence for a consumer whose gradient comes back whole and equal on every tp
    rank (a replicated computation, e.g. the MoE router and dispatch), so the backward keeps this
    rank's slice instead of summing: Megatron-LM's gather_from_sequence_parallel_region with
    tensor_parallel_output_grad=False (core/tensor_parallel/mappings.py)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather_dim0(x, group)

    @staticmethod
    def backward(ctx, g):
        return _split_dim0(g, ctx.group), None


class _ReduceScatterToSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_dim0(x, group)

    @staticmethod
    def backward(ctx, g):
        return _all_gather_dim0(g, ctx.group), None


class _ScatterToSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_dim0(x, group)

    @staticmethod
    def backward(ctx, g):
        return _all_gather_dim0(g, ctx.group), None


class _SPColumnLinear(torch.autograd.Function):
    """All-gather the sequence shard, then y = x A^T (+ b), keeping only the shard for backward and
    gathering it again there (Megatron-LM core/tensor_parallel/layers.py
    LinearWithGradAccumulationAndAsyncCommunication with sequence_parallel: save_for_backward(input)
    before the all-gather; Korthikanti et al. 2022, Sec. 4.2.2). Autograd through gather + F.linear
    would keep the whole gathered input, t times the shard, for every column-parallel GEMM."""

    @staticmethod
    def forward(ctx, x, weight, bias, group):
        ctx.group, ctx.has_bias = group, bias is not None
        ctx.save_for_backward(x, weight)
        return F.linear(_all_gather_dim0(x, group), weight, bias)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        full = _all_gather_dim0(x, ctx.group)
        g2 = g.reshape(-1, g.shape[-1])
        grad_weight = g2.t().matmul(full.reshape(-1, full.shape[-1]))
        grad_bias = g2.sum(dim=0) if ctx.has_bias else None
        # Each rank's input gradient is a partial sum over its output features: reduce-scatter it
        # back to the sequence shards (gather_from_sp's backward).
        grad_x = _reduce_scatter_dim0(g.matmul(weight), ctx.group)
        return grad_x, grad_weight, grad_bias, None


def sp_column_linear(x, weight, bias, group):
    return _SPColumnLinear.apply(x, weight, bias, group)


def copy_to_tp(x, group):
    return x if _world(group) == 1 else _CopyToTP.apply(x, group)


def reduce_from_tp(x, group):
    return x if _world(group) == 1 else _ReduceFromTP.apply(x, group)


def gather_from_sp(x, group):
    return x if _world(group) == 1 else _GatherFromSP.apply(x, group)


def gather_replicated(x, group):
    return x if _world(group) == 1 else _GatherReplicated.apply(x, group)


def reduce_scatter_to_sp(x, group):
    return x if _world(group) == 1 else _ReduceScatterToSP.apply(x, group)


def scatter_to_sp(x, group):
    return x if _world(group) == 1 else _ScatterToSP.apply(x, group)


# --------------------------------------------------------------------------- initialisation


def full_normal(shape: tuple[int, ...], std: float, seed: int, name: str) -> torch.Tensor:
    """A full (unsharded) N(0, std) matrix that depends only on (seed, name), never on tp."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    g = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))
    return torch.randn(shape, generator=g, dtype=torch.float32) * std


def mark_tensor_parallel(p: nn.Parameter, dim: int, parts: list[int]) -> nn.Parameter:
    """Mark ``p`` as a tp shard: along ``dim``, of the full blocks of sizes ``parts`` concatenated
    (each block split over the ranks, rank r holding the r-th slice of each: a fused QKV is
    [q_r; k_r; v_r])."""
    # DeepSpeed's gradient-norm code (runtime/utils.py is_model_parallel_parameter) counts a
    # parameter without this attribute on tp rank 0 only, as a replica; a sharded one on every
    # tp rank. Without it the clipped norm of a tp>1 run is wrong.
    p.tensor_model_parallel = True  # type: ignore[attr-defined]  # DeepSpeed's attribute, set per parameter
    p.tp_split = (dim, parts)  # type: ignore[attr-defined]  # dsorch's: how to join the shards (train/model/gather.py)
    return p


class TPContext:
    """What a tensor-parallel layer needs to know: its group, rank and degree, and whether
    activations between blocks are sequence-parallel."""

    def __init__(self, group, sequence_parallel: bool):
        self.group = group
        self.size = _world(group)
        self.rank = 0 if self.size == 1 else dist.get_rank(group)
        self.sequence_parallel = sequence_parallel and self.size > 1

    def shard(self, full: torch.Tensor, dim: int) -> torch.Tensor:
        if full.shape[dim] % self.size:
            raise ValueError(f"dimension {full.shape[dim]} is not divisible by tp={self.size}")
        return full.chunk(self.size, dim=dim)[self.rank].clone()

    def enter(self, x):
        """Into a column-parallel GEMM: gather the sequence (SP) or mark for grad all-reduce. At
        tp = 1, x itself, decided on the cached degree (the operators would ask the group's size
        again on every call, a cost on the tp = 1 hot path: scripts/bench_train.py)."""
        if self.size == 1:
            return x
        return gather_from_sp(x, self.group) if self.sequence_parallel else copy_to_tp(x, self.group)

    def leave(self, x):
        """Out of a row-parallel GEMM: sum partial results, scattering the sequence under SP."""
        if self.size == 1:
            return x
        return reduce_scatter_to_sp(x, self.group) if self.sequence_parallel else reduce_from_tp(x, self.group)

    def replicated(self, p):
        """A replicated weight applied to a sequence shard (norms, row-parallel bias under SP):
        each rank sees part of the tokens, so its gradient must be summed over the tp group.
        Megatron does this after backward (allreduce_sequence_parallel_grads); doing it inside
        the graph keeps it correct under DeepSpeed's engines, which know nothing of SP."""
        return copy_to_tp(p, self.group) if self.sequence_parallel else p


# --------------------------------------------------------------------------- layers


class ColumnParallelLinear(nn.Module):
    """y = x A^T with A split by rows (output features) over the tp group.

    ``full_weights`` are the full [out, in] blocks this GEMM fuses (e.g. Q, K, V); each is
    split into tp row blocks and rank r holds the r-th block of each, concatenated, so that a
    fused QKV or gate/up projection splits per head / per feature consistently.
    """

    def __init__(self, tp: TPContext, full_weights: list[torch.Tensor], bias: bool):
        super().__init__()
        self.tp = tp
        parts = [w.shape[0] for w in full_weights]
        self.weight = mark_tensor_parallel(
            nn.Parameter(torch.cat([tp.shard(w, 0) for w in full_weights], dim=0)), 0, parts
        )
        self.bias = mark_tensor_parallel(nn.Parameter(torch.zeros(self.weight.shape[0])), 0, parts) if bias else None

    def forward(self, x):
        if self.tp.sequence_parallel:
            return sp_column_linear(x, self.weight, self.bias, self.tp.group)
        return F.linear(self.tp.enter(x), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = x A^T with A split by columns (input features); the partial products are summed."""

    def __init__(self, tp: TPContext, full_weight: torch.Tensor, bias: bool):
        super().__init__()
        self.tp = tp
        self.weight = mark_tensor_parallel(nn.Parameter(tp.shard(full_weight, 1)), 1, [full_weight.shape[1]])
        # The bias is replicated and added once, after the reduction.
        self.bias = nn.Parameter(torch.zeros(full_weight.shape[0])) if bias else None

    def forward(self, x):
        y = self.tp.leave(F.linear(x, self.weight))
        return y if self.bias is None else y + self.tp.replicated(self.bias)


class VocabParallelEmbedding(nn.Module):
    """Embedding table split by vocabulary rows; out-of-shard ids contribute zeros and the
    tp ranks' results are summed (Megatron-LM tensor_parallel/layers.py)."""

    def __init__(self, tp: TPContext, full_weight: torch.Tensor):
        super().__init__()
        self.tp = tp
        self.weight = mark_tensor_parallel(nn.Parameter(tp.shard(full_weight, 0)), 0, [full_weight.shape[0]])
        self.per_rank = full_weight.shape[0] // tp.size
        self.start = tp.rank * self.per_rank

    def forward(self, ids):
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        outside = (local < 0) | (local >= self.per_rank)
        local = local.masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return out  # partial: the caller reduces (all-reduce, or reduce-scatter under SP)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits split along the vocabulary, without gathering them
    (Megatron-LM tensor_parallel/cross_entropy.py): three all-reduces of [s, b] tensors."""

    @staticmethod
    def forward(ctx, logits, target, group, vocab_start):
        logits = logits.float()
        n = _world(group)
        logits_max = logits.max(dim=-1).values
        if n > 1:
            dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=group)
        logits = logits - logits_max.unsqueeze(-1)

        v_local = logits.shape[-1]
        local_t = target - vocab_start
        outside = (local_t < 0) | (local_t >= v_local)
        local_t = local_t.masked_fill(outside, 0)
        predicted = logits.gather(-1, local_t.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        exp = logits.exp()
        sum_exp = exp.sum(dim=-1)
        if n > 1:
            dist.all_reduce(predicted, group=group)
            dist.all_reduce(sum_exp, group=group)
        loss = sum_exp.log() - predicted

        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, local_t, outside)
        return loss

    @staticmethod
    def backward(ctx, g):
        softmax, local_t, outside = ctx.saved_tensors
        grad = softmax  # d loss / d logits = softmax - onehot(target)
        inside = (~outside).to(grad.dtype)
        grad.scatter_add_(-1, local_t.unsqueeze(-1), -inside.unsqueeze(-1))
        return grad * g.unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(logits, target, tp: TPContext) -> torch.Tensor:
    """Mean next-token loss from vocab-parallel logits [s, b, V/tp] and targets [s, b]. With the
    whole vocabulary here (tp = 1) it is torch's own cross-entropy, in fp32 as above, reducing to
    the mean itself: one op and one backward instead of the custom function's dozen, and no
    per-token loss tensor to average (on one CPU core, the tiny model's [64, 1, 256] logits take
    75 us forward and backward this way, 139 us with reduction="none" and a mean, 163 us through
    the custom function)."""
    if tp.size == 1:
        v = logits.shape[-1]
        return F.cross_entropy(logits.float().reshape(-1, v), target.reshape(-1))
    return _VocabParallelCrossEntropy.apply(logits, target, tp.group, tp.rank * logits.shape[-1]).mean()


def scaled_std(std: float, num_layers: int) -> float:
    """Output-projection init of GPT-2 / Megatron (--init-method-std scaled by 1/sqrt(2L))."""
    return std / math.sqrt(2.0 * num_layers)
