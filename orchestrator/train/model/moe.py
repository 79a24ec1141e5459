"""The mixture-of-experts feed-forward of the bundled entrypoint, with expert parallelism.

One MoE layer replaces a decoder layer's MLP (``spec.model.is_moe_layer(i)``): a router scores
every token against the ``E`` routed experts, each token goes to its ``top_k`` best, and the shared
experts (DeepSeekMoE, Dai et al. 2024) see every token. Routing follows Megatron-Core
(core/transformer/moe/router.py TopKRouter, moe_utils.py topk_routing_with_score_function):

* the router is an h x E matrix applied in **fp32** (``_RouterLinear``), as Megatron-LM's
  ``--moe-router-dtype fp32`` (moe_utils.py RouterGatingLinearFunction) and DeepSpeed's TopKGate
  (``input.float()``) do and as Megatron-Bridge's DeepSeek and Qwen3 recipes set: the choice of
  experts is discrete, and bf16 logits (8 mantissa bits) make near-ties, and so the expert a token
  goes to, depend on summation order. The GEMM is h x E per token, next to nothing; the input is
  kept for backward in the model's dtype and cast again there (Megatron's function does the same);
* scores are a softmax over all experts or per-expert sigmoids (``moe.router``); the top_k are
  chosen among the best ``group_top_k`` of ``groups`` expert groups when set (group score: the sum
  of the group's best top_k / group_top_k scores, moe_utils.py group_limited_topk); the chosen
  scores are renormalised to sum to 1 when ``norm_top_k`` (for softmax this equals Megatron's
  softmax over the top-k logits) and multiplied by ``scale``;
* with ``capacity_factor`` each expert takes at most ceil(T top_k / E x capacity_factor) of a
  micro-batch's T tokens, those with the highest probabilities (Megatron's drop policy "probs",
  moe_utils.py apply_router_token_dropping); the others lose that expert, the probabilities of
  their other experts are not renormalised. None: dropless;
* load balancing is the Switch Transformer's auxiliary loss (Fedus et al. 2021, Sec. 2.2, eq. 4-6)
  in Megatron's top-k form (moe_utils.py switch_load_balancing_loss_func):
  ``aux_loss_coeff * E * sum_i f_i P_i`` over the micro-batch, f_i the fraction of the T x top_k
  routes that chose expert i, P_i the mean score of expert i (scores over all experts, sigmoid ones
  normalised per token; compute_routing_scores_for_aux_loss); or per sequence (``seq_aux_loss``,
  DeepSeek-V2/V3, eq. 17-20 of the V3 report; sequence_load_balancing_loss_func), averaged over
  the micro-batch's sequences. Its gradient enters as Megatron's MoEAuxLossAutoScaler does: attached
  to the routing probabilities, scaled like the language-model loss (``AuxLossScale``), so the
  pipeline engine needs no second output. The logged loss is the language-model loss, as
  Megatron-LM logs it.

Expert parallelism (the deepspeed runtime's rule: ep divides dp, etp == tp): the ``ep`` consecutive
data-parallel ranks of a stage and tp rank form an expert group; rank r of it holds experts
r E/ep .. (r+1) E/ep - 1 whole along the expert axis and split over the tp group like the dense
MLP (column-parallel gate/up, row-parallel down). A micro-batch's token copies are sorted by
expert, sent to the ranks of their experts with ``torch.distributed.all_to_all_single`` over the
expert group (gloo implements it with uneven splits: alltoallv; measured on 2 CPU ranks, ~0.46 ms
for a [1024, 64] fp32 exchange), the received ones regrouped by local expert, run, and sent back the
same way; each token's outputs are summed with its probabilities. Across tp ranks the routing is
replicated: every tp rank routes the same tokens (under sequence parallelism the layer gathers the
sequence first and scatters it after; the gradient comes back whole on every tp rank, so the
gather's backward is a split, not a reduce-scatter), so the expert inputs are equal on the tp group
and the expert GEMMs are the dense MLP's Megatron f/g pair.

Why not ``deepspeed.moe.layer.MoE`` (DeepSpeed 0.19.8, moe/sharded_moe.py): its gate is softmax
only (no sigmoid router, no grouped top-k, no choice of renormalisation), its auxiliary loss is
its own variant (mean(me * ce) E^2 / k), top-1 and top-2 gating sample by default (random token
selection, jittered second expert), it dispatches through dense [E, capacity, h] buffers padded to
the largest expert's load even when dropless, its forward returns (output, l_aux, counts) that the
caller must add to the loss (DeepSpeed's pipeline engine passes one tensor between stages), and
with tensor parallelism its experts are replicated over the tp ranks (each takes 1/tp of the
tokens), not split as etp == tp says. DeepSpeed's newer AutoEP (module_inject/auto_ep*.py) replaces
Hugging Face MoE blocks by preset and does not compose with the pipeline engine. So the layer is
this module's own; what it takes from DeepSpeed is the gradient reduction and optimizer
partitioning of expert parameters. DeepSpeed's engine turns that on for modules that are instances
of ``deepspeed.moe.layer.MoE`` (runtime/engine.py _configure_distributed_model: has_moe_layers)
and parameters marked ``allreduce = False`` with a ``group_name`` (moe/experts.py): their optimizer
param groups are split off (moe/utils.py configure_moe_param_groups), ZeRO-1/2 reduce-scatters and
partitions them over the expert data-parallel group (zero/stage_1_and_2.py _configure_moe_settings)
and divides them by the whole dp degree (engine.py _reduce_expert_gradients: "to maintain the
gradients value unaffected by ep_size setting"), the gradient norm sums the experts over the
expert group, and checkpoints write one file per expert and layer (engine.py
_save_moe_checkpoint, which finds experts under ``deepspeed_moe.experts.deepspeed_experts.<i>``:
hence the names here). ``ExpertParallelMoE`` is that marker, used at ep > 1; the expert groups are
DeepSpeed's own (utils/groups.py _create_expert_data_and_model_parallel, made once before the model
by ``expert_groups``), whose layout is the rule's: expert groups of ep consecutive dp ranks with the
same tp rank and stage, expert data-parallel groups strided across them. At ep = 1 the layer is a
plain module and its experts ordinary data-parallel parameters (so ZeRO-3 and DeepSpeed's universal
checkpoint apply to it as to a dense model).

What DeepSpeed 0.19.8 cannot do with these parameters, and the entrypoint therefore refuses at
ep > 1 (train/loop/config.py): ZeRO-3 (engine.py _validate_zero3_moe_compatibility refuses native MoE
layers), ZeRO-0 in fp32 (its gradient clipping, runtime/utils.py clip_grad_norm_, averages each
rank's norm over the dp group instead of summing the experts': a clipped step differs from the
single-process one), and the universal checkpoint (ds_to_universal merges ZeRO partitions over the
data-parallel group and knows only AutoEP's expert layout).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from deepspeed.moe.layer import MoE as DeepSpeedMoE
from torch import nn

from orchestrator.spec.model import ModelSpec
from orchestrator.train.model.tensor_parallel import TPContext, full_normal, gather_replicated, scatter_to_sp

# --------------------------------------------------------------------------- expert groups


def expert_group_name(ep: int) -> str:
    """DeepSpeed's name of the expert (and expert data-parallel) groups of degree ep (moe/layer.py)."""
    return f"ep_size_{ep}"


@dataclass(frozen=True)
class EPContext:
    """This rank's expert-parallel group, rank and degree (size 1: no expert parallelism)."""

    group: object = None
    size: int = 1
    rank: int = 0


def expert_groups(ep: int, grid) -> EPContext:
    """Make DeepSpeed's expert and expert data-parallel groups of degree ``ep`` (every rank, once,
    before the model: torch's new_group is collective over the world) and return this rank's.
    ``grid`` is DeepSpeed's PipelineParallelGrid of the run, the mpu its groups module reads."""
    if ep == 1:
        return EPContext()
    from deepspeed.utils import groups

    groups.mpu = grid  # as the engine sets it (engine.py _configure_distributed_model)
    name = expert_group_name(ep)
    if name not in groups._get_expert_parallel_group_dict():
        groups._create_expert_data_and_model_parallel(ep, mpu=grid)
    group = groups._get_expert_parallel_group(name)
    return EPContext(group, ep, dist.get_rank(group))


# --------------------------------------------------------------------------- autograd pieces


class AuxLossScale:
    """d(loss that backward starts from) / d(language-model loss): what the auxiliary loss's
    gradient is multiplied by so that it enters as if added to the loss (Megatron's
    MoEAuxLossAutoScaler.set_loss_scale). DeepSpeed divides the loss by the gradient-accumulation
    steps (and multiplies it by the fp16 loss scale) before backward; the trainer sets this each step."""

    def __init__(self, value: float = 1.0):
        self.value = value


class _AttachAuxLoss(torch.autograd.Function):
    """Identity on ``x``; in backward, also the gradient ``scale`` of the scalar ``aux`` (Megatron-LM
    moe_utils.py MoEAuxLossAutoScaler). Keeps nothing for backward."""

    @staticmethod
    def forward(ctx, x, aux, scale: AuxLossScale):
        ctx.scale = scale
        return x

    @staticmethod
    def backward(ctx, g):
        return g, torch.full((), ctx.scale.value, dtype=torch.float32, device=g.device), None


class _RouterLinear(torch.autograd.Function):
    """fp32 logits x W^T (+ b) keeping x and W in their own dtype for backward (Megatron-LM
    moe_utils.py RouterGatingLinearFunction): no fp32 copy of the tokens is kept."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return F.linear(x.float(), weight.float(), None if bias is None else bias.float())

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        grad_x = g.matmul(weight.float()).to(x.dtype)
        grad_w = g.t().matmul(x.float()).to(weight.dtype)
        grad_b = g.sum(0).to(weight.dtype) if ctx.has_bias else None
        return grad_x, grad_w, grad_b


class _AllToAll(torch.autograd.Function):
    """Rows of ``x`` in ``send`` blocks to the group's ranks, ``recv`` rows from each back; the
    backward is the reverse exchange. Keeps nothing for backward."""

    @staticmethod
    def forward(ctx, x, send: list[int], recv: list[int], group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _all_to_all(x, send, recv, group)

    @staticmethod
    def backward(ctx, g):
        return _all_to_all(g, ctx.recv, ctx.send, ctx.group), None, None, None


def _all_to_all(x, send, recv, group):
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
    return out


# --------------------------------------------------------------------------- routing


@dataclass(frozen=True)
class Routes:
    """A micro-batch's routing: each token's top_k experts (``experts`` [T, k]) and probabilities
    (``probs`` [T, k], carrying the auxiliary loss), and which routes survive the capacity (``keep``
    [T, k] bool, None when dropless)."""

    experts: torch.Tensor
    probs: torch.Tensor
    keep: torch.Tensor | None


def route(logits: torch.Tensor, moe, seqs: int, aux_scale: AuxLossScale | None) -> Routes:
    """Top-k routing of fp32 ``logits`` [T, E] (T = s x seqs tokens, sequence-major), as the module
    docstring states. ``aux_scale`` None: no auxiliary loss (evaluation)."""
    k, num_experts = moe.top_k, moe.num_experts
    scores = torch.softmax(logits, dim=-1) if moe.router == "softmax" else torch.sigmoid(logits)
    with torch.no_grad():  # the choice is not differentiated; only the chosen scores are
        experts = _top_k(scores, moe)
    probs = scores.gather(1, experts)
    if moe.norm_top_k and k > 1:
        probs = probs / probs.sum(dim=-1, keepdim=True)
    if moe.scale != 1.0:
        probs = probs * moe.scale
    keep = None
    if moe.capacity_factor is not None:
        keep = _within_capacity(probs.detach(), experts, num_experts, moe.capacity_factor)
    if aux_scale is not None and moe.load_balancing != "none" and moe.aux_loss_coeff > 0:
        aux = load_balancing_loss(scores, experts, moe, seqs)
        probs = _AttachAuxLoss.apply(probs, aux, aux_scale)
    return Routes(experts, probs, keep)


def _top_k(scores: torch.Tensor, moe) -> torch.Tensor:
    """The top_k experts of each token, within its best group_top_k groups when grouped."""
    if moe.groups is None:
        return scores.topk(moe.top_k, dim=-1).indices
    t, e = scores.shape
    by_group = scores.view(t, moe.groups, e // moe.groups)
    group_score = by_group.topk(moe.top_k // moe.group_top_k, dim=-1).values.sum(dim=-1)
    best = group_score.topk(moe.group_top_k, dim=-1).indices
    allowed = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, best, True)
    masked = by_group.masked_fill(~allowed.unsqueeze(-1), float("-inf")).view(t, e)
    return masked.topk(moe.top_k, dim=-1).indices


def _within_capacity(probs, experts, num_experts: int, capacity_factor: float) -> torch.Tensor:
    """Which routes an expert takes: its ceil(T k / E cf) most probable (Megatron's drop policy
    "probs"); [T, k] bool."""
    t, k = experts.shape
    capacity = math.ceil(t * k / num_experts * capacity_factor)
    if capacity >= t:
        return torch.ones_like(experts, dtype=torch.bool)
    dense = torch.zeros((t, num_experts), dtype=probs.dtype, device=probs.device).scatter_(1, experts, probs)
    chosen = torch.zeros_like(dense, dtype=torch.bool).scatter_(0, dense.topk(capacity, dim=0).indices, True)
    return chosen.gather(1, experts)


def load_balancing_loss(scores: torch.Tensor, experts: torch.Tensor, moe, seqs: int) -> torch.Tensor:
    """``aux_loss_coeff * E * sum_i f_i P_i`` (module docstring) over the micro-batch, or per
    sequence averaged over its ``seqs`` sequences. f counts the top-k choices (before any capacity
    drop); P are the scores over all experts, sigmoid ones normalised per token."""
    t, num_experts = scores.shape
    k = moe.top_k
    if moe.router == "sigmoid":
        scores = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20)
    with torch.no_grad():
        chosen = torch.zeros_like(scores).scatter_(1, experts, 1.0)
    if moe.load_balancing == "seq_aux_loss":
        s = t // seqs
        f = chosen.view(s, seqs, num_experts).sum(0) / (s * k)  # [seqs, E]
        p = scores.view(s, seqs, num_experts).mean(0)
        return moe.aux_loss_coeff * num_experts * (f * p).sum(-1).mean()
    f = chosen.sum(0) / (t * k)
    return moe.aux_loss_coeff * num_experts * (f * scores.mean(0)).sum()


# --------------------------------------------------------------------------- the layer

# (ffn_hidden_size, tp context, name) -> a (gated) tensor-parallel MLP: train/model/decoder.py FeedForward.
MakeFFN = Callable[[int, TPContext, str], nn.Module]


class MoEFeedForward(nn.Module):
    """Router, this rank's routed experts and the shared experts of one MoE layer: [s(/tp), b, h] in
    and out, like the dense MLP it replaces (its input is the post-attention norm's output)."""

    def __init__(
        self,
        model: ModelSpec,
        tp: TPContext,
        ep: EPContext,
        seed: int,
        index: int,
        make_ffn: MakeFFN,
        aux_scale: AuxLossScale,
    ):
        # Not super().__init__(): ExpertParallelMoE puts DeepSpeed's MoE after this class, and its
        # constructor builds DeepSpeed's own gate and experts.
        nn.Module.__init__(self)
        moe = model.moe
        assert moe is not None  # layer_specs builds this only for MoE layers
        h, name = model.hidden_size, f"layers.{index}"
        self.moe, self.tp, self.ep, self.aux_scale = moe, tp, ep, aux_scale
        self.num_experts, self.ep_size = moe.num_experts, ep.size
        self.num_local_experts = moe.num_experts // ep.size
        self.expert_group_name = expert_group_name(ep.size)
        # Replicated over tp and dp, like the norms (its input is replicated over the tp group).
        self.router = nn.Parameter(full_normal((moe.num_experts, h), model.init_method_std, seed, f"{name}.router"))
        self.router_bias = nn.Parameter(torch.zeros(moe.num_experts)) if model.bias else None
        first = ep.rank * self.num_local_experts
        # Each expert split over the tp group as the dense MLP is, on inputs equal across it.
        expert_tp = TPContext(tp.group, sequence_parallel=False)
        experts = [
            make_ffn(moe.ffn_hidden_size, expert_tp, f"{name}.experts.{e}")
            for e in range(first, first + self.num_local_experts)
        ]
        # DeepSpeed's names for routed experts (see the module docstring): plain containers.
        self.deepspeed_moe = nn.Module()
        self.deepspeed_moe.experts = nn.Module()
        self.deepspeed_moe.experts.deepspeed_experts = nn.ModuleList(experts)
        self.shared = make_ffn(moe.shared_ffn, tp, f"{name}.shared") if moe.shared_experts else None
        self.shared_gate = (
            nn.Parameter(full_normal((1, h), model.init_method_std, seed, f"{name}.shared_gate"))
            if moe.shared_expert_gate
            else None
        )
        # The token copies the last forward sent to the experts and ran through this rank's experts
        # (the activation census reads them).
        self.sent_tokens = self.routed_tokens = 0

    @property
    def experts(self) -> nn.ModuleList:
        return cast(nn.ModuleList, self.deepspeed_moe.get_submodule("experts.deepspeed_experts"))

    def forward(self, x):
        tp = self.tp
        full = gather_replicated(x, tp.group) if tp.sequence_parallel else x
        s, b, h = full.shape
        tokens = full.reshape(s * b, h)
        logits = _RouterLinear.apply(tokens, self.router, self.router_bias)
        routes = route(logits, self.moe, b, self.aux_scale if self.training else None)
        y = self._dispatch(tokens, routes).view(s, b, h)
        if tp.sequence_parallel:
            y = scatter_to_sp(y, tp.group)
        if self.shared is not None:
            shared = self.shared(x)
            if self.shared_gate is not None:  # Qwen2-MoE's sigmoid gate on the shared experts' output
                shared = shared * torch.sigmoid(F.linear(x, tp.replicated(self.shared_gate)))
            y = y + shared
        return y

    def _dispatch(self, tokens, routes: Routes):
        """Token copies to their experts (over the expert group), through them and back, summed
        with their probabilities: [T, h] -> [T, h]."""
        t, k = routes.experts.shape
        flat = routes.experts.reshape(-1)
        if routes.keep is not None:  # dropped routes sort last, past every expert, and are cut off
            flat = flat.masked_fill(~routes.keep.reshape(-1), self.num_experts)
        order = torch.argsort(flat, stable=True)  # routes grouped by expert, in token order
        counts = torch.bincount(flat, minlength=self.num_experts + 1)[: self.num_experts]
        self.sent_tokens = int(counts.sum())
        order = order[: self.sent_tokens]
        token = order // k
        permuted = tokens.index_select(0, token)
        weights = routes.probs.reshape(-1).index_select(0, order)
        out = self._experts(permuted, counts)
        # index_put keeps only the indices for backward; index_add would keep the weighted rows too.
        combined = tokens.new_zeros(tokens.shape)
        return combined.index_put((token,), out * weights.to(out.dtype).unsqueeze(-1), accumulate=True)

    def _experts(self, permuted, counts):
        """Rows sorted by global expert (``counts`` [E] per expert) through the experts that hold
        them, the results back in the same order."""
        local = self.num_local_experts
        if self.ep.size == 1:
            return self._run_local(permuted, counts.tolist())
        ep, group = self.ep.size, self.ep.group
        to_rank = counts.view(ep, local)
        from_rank = torch.empty_like(to_rank)  # [source rank, local expert]
        dist.all_to_all_single(from_rank, to_rank, group=group)
        send, recv = to_rank.sum(1).tolist(), from_rank.sum(1).tolist()
        received = _AllToAll.apply(permuted, send, recv, group)
        # Source-major (rank 0's rows for each local expert, then rank 1's ...) to expert-major.
        sizes = from_rank.flatten().tolist()
        chunks = received.split(sizes)
        by_expert = [chunks[r * local + e] for e in range(local) for r in range(ep)]
        out = self._run_local(torch.cat(by_expert), from_rank.sum(0).tolist())
        back = out.split([sizes[r * local + e] for e in range(local) for r in range(ep)])
        source_major = torch.cat([back[e * ep + r] for r in range(ep) for e in range(local)])
        return _AllToAll.apply(source_major, recv, send, group)

    def _run_local(self, rows, sizes: list[int]):
        """Every local expert on its block of ``rows`` (sizes per local expert). An expert with no
        rows still runs, on an empty block: each rank must produce a gradient for each of its
        expert parameters, or DeepSpeed's gradient buckets differ between ranks."""
        self.routed_tokens = rows.shape[0]
        return torch.cat([expert(block) for expert, block in zip(self.experts, rows.split(sizes), strict=True)])


class ExpertParallelMoE(MoEFeedForward, DeepSpeedMoE):
    """The MoE layer at ep > 1, an instance of DeepSpeed's MoE so that its engine reduces and
    partitions the routed experts over the expert data-parallel group (module docstring). Only
    DeepSpeed's type is taken: its constructor is not run (MoEFeedForward.__init__) and its forward
    is not used; the attributes its engine reads (num_experts, num_local_experts, expert_group_name,
    ep_size) are set by MoEFeedForward."""

    def __init__(self, *args, **kwargs):
        MoEFeedForward.__init__(self, *args, **kwargs)
        self.enable_expert_tensor_parallelism = self.tp.size > 1  # DeepSpeed's flops profiler reads it
        self.use_residual = False
        for p in self.experts.parameters():
            # DeepSpeed's marks of an expert parameter (moe/experts.py Experts).
            p.allreduce = False
            p.group_name = self.expert_group_name

    def set_deepspeed_parallelism(self, use_data_before_expert_parallel_: bool = False) -> None:
        """Called by DeepSpeed's engine on every module that has it: the groups exist already
        (``expert_groups``), made before the model as the layer needs its group to be built."""


def moe_layer(
    model: ModelSpec, tp: TPContext, ep: EPContext, seed: int, index: int, make_ffn: MakeFFN, aux_scale: AuxLossScale
) -> MoEFeedForward:
    cls = ExpertParallelMoE if ep.size > 1 else MoEFeedForward
    return cls(model, tp, ep, seed, index, make_ffn, aux_scale)
