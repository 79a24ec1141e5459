"""A Llama-style decoder (RMSNorm, RoPE, SwiGLU or GeLU MLP, GQA, optional QK-norm) built from
tensor-parallel layers, as a flat list of pipeline layers: embedding, N decoder blocks, final norm,
output head. The blocks of ``model.is_moe_layer(i)`` have a mixture-of-experts feed-forward
(train/model/moe.py) in place of the MLP.

The same list serves both engines: DeepSpeed's PipelineModule builds the layers of its own
stage from the LayerSpecs (pp > 1), and ``DenseModel`` runs them all in sequence (pp = 1, where
DeepSpeed's ordinary engine allows ZeRO-2/3). Activations between layers are [seq, batch,
hidden], sequence-sharded over the tp group when sequence parallelism is on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
from torch import nn
from torch.utils.checkpoint import checkpoint

from orchestrator.plan.layout import Layout
from orchestrator.spec.model import ModelSpec
from orchestrator.train.model.moe import AuxLossScale, EPContext, moe_layer
from orchestrator.train.model.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    TPContext,
    VocabParallelEmbedding,
    copy_to_tp,
    full_normal,
    scaled_std,
    scatter_to_sp,
    vocab_parallel_cross_entropy,
)

# Non-reentrant checkpointing (PyTorch's recommended variant) works with inputs that do not
# require grad and with the tp collectives inside the block, which are simply replayed.
recompute = functools.partial(checkpoint, use_reentrant=False)
# The spec's default norm epsilon (model.norm_epsilon, Megatron-LM's --norm-epsilon), for the norm's own tests.
NORM_EPS = ModelSpec.model_fields["norm_epsilon"].default


def _gate(g, kind):
    # SwiGLU: silu (Shazeer 2020); GeGLU: Gemma's tanh approximation of gelu.
    return F.silu(g) if kind == "swiglu" else F.gelu(g, approximate="tanh")


class _GatedActivation(torch.autograd.Function):
    """act(g) * u from the fused gate/up output [.., 2f], keeping only that output for backward and
    recomputing act(g) there, as Megatron-LM's fused SwiGLU does (core/fusions/fused_bias_swiglu.py
    SwiGLUFunction saves its input). Autograd through act(g) * u would also keep act(g).

    The gate's gradient is ATen's own silu/gelu backward kernel (what autograd runs for F.silu /
    F.gelu), written straight into the gradient's half: four kernels in all. On one CPU core, for
    the tiny model's [64, 1, 352], forward and backward take 108 us, 127 us with the derivative
    written out in element-wise ops, 75 us through autograd's silu(g) * u, which runs the same
    kernels without a Python backward."""

    @staticmethod
    def forward(ctx, gu, kind):
        ctx.kind = kind
        ctx.save_for_backward(gu)
        g, u = gu.chunk(2, dim=-1)
        return _gate(g, kind) * u

    @staticmethod
    def backward(ctx, grad):
        (gu,) = ctx.saved_tensors
        g, u = gu.chunk(2, dim=-1)
        out = torch.empty_like(gu)
        out_g, out_u = out.chunk(2, dim=-1)
        grad_a = grad * u  # d loss / d act(g)
        if ctx.kind == "swiglu":
            torch.ops.aten.silu_backward.grad_input(grad_a, g, grad_input=out_g)
        else:
            torch.ops.aten.gelu_backward.grad_input(grad_a, g, approximate="tanh", grad_input=out_g)
        torch.mul(grad, _gate(g, ctx.kind), out=out_u)
        return out, None


def gated_activation(gu, kind: str):
    return _GatedActivation.apply(gu, kind)


class Norm(nn.Module):
    def __init__(self, model: ModelSpec, tp: TPContext):
        super().__init__()
        self.tp, self.eps, self.rms = tp, model.norm_epsilon, model.normalization == "rmsnorm"
        self.weight = nn.Parameter(torch.ones(model.hidden_size))
        self.bias = None if self.rms else nn.Parameter(torch.zeros(model.hidden_size))

    def forward(self, x):
        w = self.tp.replicated(self.weight)
        if self.rms:  # Zhang & Sennrich 2019; statistics in fp32 as in Llama's reference code
            return _RMSNorm.apply(x, w, self.eps)
        return F.layer_norm(x, (x.shape[-1],), w, self.tp.replicated(self.bias), self.eps)


def _stats_dtype(x):
    """The norm's statistics in fp32 (or better), as in Llama's reference code; fp32 stays itself."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _as(t, dtype):
    return t if t.dtype == dtype else t.to(dtype)


# torch's fused RMSNorm kernels (forward returns 1/rms beside the output; the backward takes it back):
# one kernel each way on GPUs. Their backward has no CPU kernel (torch 2.13), and older torch lacks
# them, so CPU ranks and those versions use the math below.
_FUSED_RMS_NORM = hasattr(torch, "_fused_rms_norm") and hasattr(torch.ops.aten, "_fused_rms_norm_backward")


class _RMSNorm(torch.autograd.Function):
    """RMSNorm(x) * weight keeping only the 16-bit input and the fp32 1/rms per token for backward,
    as Megatron's fused norms keep their input and rsigma. Autograd through the fp32 statistics
    would also keep x.float() and the normalized tensor: 3 x the input's bytes.

    On CPU, written for few kernel launches: on the tiny model's [64, 1, 64] activations a forward and
    backward takes 121 us on one CPU core against 140 us before and 150 us for autograd through
    F.rms_norm (torch 2.13's CPU rms_norm is composite). In-place ops only on fresh tensors."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        ctx.fused = x.is_cuda and _FUSED_RMS_NORM
        if ctx.fused:
            y, rstd = torch._fused_rms_norm(x, [x.shape[-1]], weight, eps)
        else:
            xf = _stats_dtype(x)
            rstd = xf.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()
            y = _as(xf * rstd, x.dtype) * weight
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        if ctx.fused:
            grad_x, grad_weight = torch.ops.aten._fused_rms_norm_backward(
                grad.contiguous(), x, [x.shape[-1]], rstd, weight, [True, True]
            )
            return grad_x, grad_weight, None
        x_hat = _stats_dtype(x) * rstd
        # The weight's gradient as autograd takes it through y * weight (y in the input's dtype);
        # the input's through the fp32 normalization: rstd (g - x_hat mean(g x_hat)).
        grad_weight = (grad * _as(x_hat, x.dtype)).sum_to_size(weight.shape)
        g = _stats_dtype(grad * weight)
        grad_x = (g - x_hat * (g * x_hat).mean(-1, keepdim=True)).mul_(rstd)
        return _as(grad_x, x.dtype), grad_weight, None


def _mlp(up, down, activation: str, x):
    u = up(x)
    if activation in ("swiglu", "geglu"):
        return down(gated_activation(u, activation))
    return down(F.gelu(u))


class FeedForward(nn.Module):
    """A (gated) MLP of intermediate size ``f``, column-parallel gate/up and row-parallel down over
    ``tp``, weights drawn full under ``name``: a routed or shared expert of a MoE layer (the dense
    layer keeps its own ``up``/``down``, whose names its checkpoints carry)."""

    def __init__(self, model: ModelSpec, f: int, tp: TPContext, name: str, *, seed: int):
        super().__init__()
        h, std = model.hidden_size, model.init_method_std

        def w(rows, cols, what, s=std):
            return full_normal((rows, cols), s, seed, f"{name}.{what}")

        ups = [w(f, h, "gate"), w(f, h, "up")] if model.gated else [w(f, h, "up")]
        self.up = ColumnParallelLinear(tp, ups, model.bias)
        self.down = RowParallelLinear(tp, w(h, f, "down", scaled_std(std, model.num_layers)), model.bias)
        self.activation = model.activation

    def forward(self, x):
        return _mlp(self.up, self.down, self.activation, x)


def rope_tables(model: ModelSpec, seq_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of RoPE (Su et al. 2021), rotate-half convention of Llama / Megatron."""
    d = model.head_dim
    inv = 1.0 / (float(model.rope_theta) ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = torch.outer(torch.arange(seq_length, dtype=torch.float32), inv)
    ang = torch.cat([ang, ang], dim=-1)  # [s, d]
    return ang.cos(), ang.sin()


def apply_rope(x, cos, sin):  # x [.., d], cos and sin broadcast to it
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Embedding(nn.Module):
    def __init__(self, model: ModelSpec, seq_length: int, tp: TPContext, seed: int):
        super().__init__()
        self.tp = tp
        self.word = VocabParallelEmbedding(
            tp, full_normal((model.vocab_size, model.hidden_size), model.init_method_std, seed, "embed")
        )
        self.pos = None
        if model.position_embedding == "learned":
            positions = model.max_position_embeddings or seq_length
            self.pos = nn.Parameter(
                full_normal((positions, model.hidden_size), model.init_method_std, seed, "pos_embed")
            )

    def forward(self, ids):  # ids [b, s] -> hidden [s(/tp), b, h]
        x = self.word(ids.t())
        if self.tp.size > 1:
            x = self.tp.leave(x)  # sum the vocab shards (reduce-scatter to sequence shards if SP)
        if self.pos is not None:
            pos = self.pos[: ids.shape[1]].unsqueeze(1)
            x = x + (scatter_to_sp(pos, self.tp.group) if self.tp.sequence_parallel else pos)
        return x

    def logits(self, x):
        """Tied output head: hidden [s(/tp), b, h] -> vocab-parallel logits [s, b, V/tp]."""
        return F.linear(self.tp.enter(x), self.word.weight)


class DecoderLayer(nn.Module):
    def __init__(
        self,
        model: ModelSpec,
        seq_length: int,
        layout: Layout,
        tp: TPContext,
        seed: int,
        index: int,
        ep: EPContext | None = None,
        aux_scale: AuxLossScale | None = None,
    ):
        super().__init__()
        h, f, d = model.hidden_size, model.ffn_hidden_size, model.head_dim
        heads, kv_heads = model.num_attention_heads, model.kv_heads
        std, out_std = model.init_method_std, scaled_std(model.init_method_std, model.num_layers)
        self.heads, self.kv_heads = heads // tp.size, kv_heads // tp.size
        self.head_dim, self.selective = d, layout.recompute == "selective"
        name = f"layers.{index}"

        def w(rows, cols, what, s=std):
            return full_normal((rows, cols), s, seed, f"{name}.{what}")

        self.input_norm = Norm(model, tp)
        self.qkv = ColumnParallelLinear(
            tp, [w(heads * d, h, "q"), w(kv_heads * d, h, "k"), w(kv_heads * d, h, "v")], model.bias or model.qkv_bias
        )
        self.out = RowParallelLinear(tp, w(h, heads * d, "o", out_std), model.bias)
        self.tp = tp
        # QK-norm (Qwen3; Megatron-LM --qk-layernorm): RMSNorm over each head's channels, one weight
        # of head_dim shared by the heads, applied to queries and keys before RoPE.
        self.q_norm = nn.Parameter(torch.ones(d)) if model.qk_norm else None
        self.norm_eps = model.norm_epsilon
        self.k_norm = nn.Parameter(torch.ones(d)) if model.qk_norm else None
        self.post_norm = Norm(model, tp)
        self.activation, self.parallel = model.activation, model.parallel_residual
        self.moe = None
        if model.is_moe_layer(index):
            make_ffn = functools.partial(FeedForward, model, seed=seed)
            self.moe = moe_layer(model, tp, ep or EPContext(), seed, index, make_ffn, aux_scale or AuxLossScale())
        else:
            ups = [w(f, h, "gate"), w(f, h, "up")] if model.gated else [w(f, h, "up")]
            self.up = ColumnParallelLinear(tp, ups, model.bias)
            self.down = RowParallelLinear(tp, w(h, f, "down", out_std), model.bias)
        cos, sin = rope_tables(model, seq_length)
        self.rope = model.position_embedding == "rope"
        # [s, 1, 1, d]: broadcast over batch and heads of the [s, b, heads, d] projections.
        self.register_buffer("cos", cos[:, None, None], persistent=False)
        self.register_buffer("sin", sin[:, None, None], persistent=False)

    def core_attention(self, q, k, v):
        # GQA (Ainslie et al. 2023): each kv head serves heads/kv_heads query heads; SDPA shares
        # them itself (enable_gqa) instead of copying k and v heads/kv_heads times.
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.heads != self.kv_heads)

    def attention(self, x):
        qkv = self.qkv(self.input_norm(x))  # [s, b, (heads + 2 kv_heads) * d], full sequence
        s, b = qkv.shape[0], qkv.shape[1]
        qkv = qkv.view(s, b, self.heads + 2 * self.kv_heads, self.head_dim)
        qk, v = qkv.split([self.heads + self.kv_heads, self.kv_heads], dim=2)
        if self.q_norm is not None:
            qk = self._qk_norm(qk)
        if self.rope:  # q and k heads rotated together: one set of element-wise ops, not two
            cos, sin = self.cos[:s].to(qk.dtype), self.sin[:s].to(qk.dtype)
            qk = apply_rope(qk, cos, sin)
        q, k = qk.split([self.heads, self.kv_heads], dim=2)
        q, k = q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3)  # [b, heads, s, d]
        # A copy, not a view: SDPA keeps v for backward, and a view would keep the whole fused QKV
        # output alive beside the rotated q and k (measured by tests/system/test_activation_census.py).
        v = v.permute(1, 2, 0, 3).contiguous()
        # Selective recomputation (Korthikanti et al. 2022, Sec. 5): keep the GEMM outputs and
        # recompute only the attention core, whose activations grow with s^2.
        o = recompute(self.core_attention, q, k, v) if self.selective else self.core_attention(q, k, v)
        return self.out(o.permute(2, 0, 1, 3).reshape(s, b, self.heads * self.head_dim))

    def _qk_norm(self, qk):
        """RMSNorm of each query and key head ([s, b, heads + kv_heads, d]). The weights see this
        rank's heads only: their gradients are summed over the tp group (copy_to_tp)."""
        q, k = qk.split([self.heads, self.kv_heads], dim=2)
        wq, wk = (copy_to_tp(p, self.tp.group) for p in (self.q_norm, self.k_norm))
        return torch.cat([_RMSNorm.apply(q, wq, self.norm_eps), _RMSNorm.apply(k, wk, self.norm_eps)], dim=2)

    def mlp(self, x):
        if self.moe is not None:
            return self.moe(self.post_norm(x))
        return _mlp(self.up, self.down, self.activation, self.post_norm(x))

    def forward(self, x):
        if self.parallel:  # GPT-J / GPT-NeoX: both branches read the block's input
            return x + self.attention(x) + self.mlp(x)
        x = x + self.attention(x)
        return x + self.mlp(x)


class OutputHead(nn.Module):
    def __init__(self, model: ModelSpec, tp: TPContext, seed: int):
        super().__init__()
        self.proj = ColumnParallelLinear(
            tp, [full_normal((model.vocab_size, model.hidden_size), model.init_method_std, seed, "output")], bias=False
        )

    def forward(self, x):
        return self.proj(x)  # vocab-parallel logits [s, b, V/tp]


class LossFn:
    """Mean next-token cross-entropy of a micro-batch, from vocab-parallel logits."""

    def __init__(self, tp: TPContext):
        self.tp = tp
        self.__name__ = "vocab_parallel_cross_entropy"

    def __call__(self, logits, labels):  # logits [s, b, V/tp], labels [b, s]
        return vocab_parallel_cross_entropy(logits, labels.t(), self.tp)


def _tied_logits(embedding: Embedding, x):
    return embedding.logits(x)


def layer_specs(
    model: ModelSpec,
    seq_length: int,
    layout: Layout,
    tp: TPContext,
    seed: int,
    ep: EPContext | None = None,
    aux_scale: AuxLossScale | None = None,
) -> list:
    """The model as pipeline layers: [embedding, decoder x L, final norm, output head]. ``ep``: this
    rank's expert group (train/model/moe.py expert_groups); ``aux_scale``: the scale of the MoE layers'
    auxiliary-loss gradient, which the trainer sets each step."""
    ep, aux_scale = ep or EPContext(), aux_scale or AuxLossScale()
    if model.tied_embeddings:
        first = TiedLayerSpec("embed", Embedding, model, seq_length, tp, seed, tied_weight_attr=["word.weight"])
        last = TiedLayerSpec(
            "embed", Embedding, model, seq_length, tp, seed, forward_fn=_tied_logits, tied_weight_attr=["word.weight"]
        )
    else:
        first, last = LayerSpec(Embedding, model, seq_length, tp, seed), LayerSpec(OutputHead, model, tp, seed)
    blocks = [
        LayerSpec(DecoderLayer, model, seq_length, layout, tp, seed, i, ep, aux_scale) for i in range(model.num_layers)
    ]
    return [first, *blocks, LayerSpec(Norm, model, tp), last]


class Pipeline(PipelineModule):
    """DeepSpeed's PipelineModule with the stage boundaries the plan states.

    DeepSpeed's own partition methods (uniform / parameters / type:regex) cannot express
    Megatron's --decoder-first/last-pipeline-num-layers, so the boundaries are set here; this
    overrides a private method of DeepSpeed 0.19 (pinned <0.20 in pyproject.toml).
    """

    def __init__(self, specs, stage_layers: tuple[int, ...], **kwargs):
        self._stage_layers = stage_layers
        super().__init__(specs, **kwargs)

    def _partition_layers(self, method="uniform"):
        bounds, total = [0], 1  # stage 0 also holds the embedding
        for n in self._stage_layers[:-1]:
            total += n
            bounds.append(total)
        bounds.append(len(self._layer_specs))  # the last stage also holds final norm and head
        self.parts = bounds
        stage = self._topo.get_coord(self.global_rank).pipe
        self._set_bounds(start=bounds[stage], stop=bounds[stage + 1])


class DenseModel(nn.Module):
    """All layers on every rank (pp = 1): the model DeepSpeed's ordinary engine trains."""

    def __init__(self, specs, loss_fn: LossFn, full_recompute: bool):
        super().__init__()
        built: list[Callable[..., Any]] = []  # the modules, and a tied module's other use (its forward_fn)
        tied: dict[str, nn.Module] = {}
        for spec in specs:
            if isinstance(spec, TiedLayerSpec) and spec.key in tied:
                built.append(functools.partial(spec.forward_fn, tied[spec.key]))
                continue
            module = spec.build()
            if isinstance(spec, TiedLayerSpec):
                tied[spec.key] = module
            built.append(module)
        self.layers = nn.ModuleList([m for m in built if isinstance(m, nn.Module)])
        self._calls = built
        self.loss_fn, self.full_recompute = loss_fn, full_recompute

    def forward(self, ids, labels):
        return self.loss_fn(self.logits(ids), labels)

    def logits(self, ids):
        """Vocab-parallel logits [s, b, V/tp] of ids [b, s]."""
        x = ids
        for layer in self._calls:
            if self.full_recompute and isinstance(layer, DecoderLayer):
                x = recompute(layer, x)  # full recomputation, one layer per checkpoint
            else:
                x = layer(x)
        return x
