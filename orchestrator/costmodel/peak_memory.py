"""The memory stack of each layout: bytes per GPU on its binding pipeline stage (the stage whose
states and activations are largest), from the per-layer formulas of costmodel/memory.py: the
activations a layer keeps (dense, MoE, and what only dsorch's entrypoint keeps), the loss's working
set, the pipeline's stage-output buffers and the engines' communication buffers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.costmodel.inputs import RECOMPUTE_CODES, _Inputs, attention_widths
from orchestrator.costmodel.memory import (
    GIB,
    activation_bytes_per_layer,
    entrypoint_extra_bytes_per_layer,
    in_flight_micro_batches,
    model_state_bytes,
    moe_activation_bytes_per_layer,
    moe_mlp_activation_bytes,
)
from orchestrator.costmodel.stacks import MemoryStack
from orchestrator.runtimes.deepspeed import ZERO3_MAX_LIVE_PARAMETERS


@dataclass(frozen=True, kw_only=True, slots=True)
class _LayerActivations:
    """Activation bytes of one decoder layer and micro-batch on one GPU."""

    saved: np.ndarray  # what a dense layer's forward keeps for the backward, at the layout's recompute level
    saved_moe: np.ndarray  # ... a MoE layer's (equal to ``saved`` for a dense model)
    # What a layer that full recomputation leaves out (recompute_layers) keeps: its whole activations.
    saved_none: np.ndarray
    saved_moe_none: np.ndarray
    working: np.ndarray  # the backward's working set of the layer being back-propagated
    saved_entrypoint: np.ndarray  # of ``saved`` and ``working``, what only dsorch's entrypoint keeps
    working_entrypoint: np.ndarray


def _moe_layer_activations(x: _Inputs, formula, level) -> np.ndarray:
    """Activation bytes of one MoE layer and micro-batch at recompute ``level``: the dense formula
    without its MLP, the shared experts as a dense MLP of their size, and the routed part, as
    Megatron-Core keeps it (memory.moe_mlp_activation_bytes) or as dsorch's entrypoint keeps it
    (train/model/moe.py; memory.moe_activation_bytes_per_layer, counted to the byte by its census)."""
    model, training = x.model, x.training
    moe = model.moe
    assert moe is not None
    s, mbs, h = x.s_local, x.micro_batch_size, float(model.hidden_size)
    if x.runtime.bundled_trainer:
        k = float(moe.top_k)
        return formula(level, 0.0) + moe_activation_bytes_per_layer(
            s,
            mbs,
            h,
            x.tp,
            x.sequence_parallel,
            level,
            num_experts=float(moe.num_experts),
            top_k=k,
            expert_ffn=float(moe.ffn_hidden_size),
            shared_ffn=float(moe.shared_ffn),
            shared_gate=moe.shared_expert_gate,
            swiglu=model.gated,
            router=moe.router,
            norm_top_k=moe.norm_top_k,
            load_balancing=moe.load_balancing if moe.aux_loss_coeff > 0 else "none",
            sent=s * mbs * k,
            received=s * mbs * k * training.moe_load_imbalance,
            act_bytes=x.act_bytes,
        )
    r, t_in = x.routed, x.router_tokens
    routed = moe_mlp_activation_bytes(
        r,
        t_in,
        h,
        float(moe.ffn_hidden_size),
        float(moe.num_experts),
        x.etp,
        level,
        gated=model.gated,
        act_bytes=x.act_bytes,
        fp8=training.fp8 is not None,
    )
    return formula(level, float(moe.shared_ffn)) + routed


def _layer_activations(x: _Inputs) -> _LayerActivations:
    model, training, tp, rc = x.model, x.training, x.tp, x.recompute
    s, mbs, sp = x.s_local, x.micro_batch_size, x.sequence_parallel  # with cp, each rank holds s/cp of every sequence
    h, f, a, kv = (
        float(model.hidden_size),
        float(model.ffn_hidden_size),
        float(model.num_attention_heads),
        float(model.kv_heads),
    )
    act_bytes = x.act_bytes
    fp8 = training.fp8 is not None
    qkvo, latent = attention_widths(model)

    def formula(level, ffn):
        return activation_bytes_per_layer(
            s,
            mbs,
            h,
            ffn,
            a,
            kv,
            tp,
            sp,
            level,
            swiglu=model.gated,
            flash=training.flash_attention,
            hidden_dropout=training.hidden_dropout > 0,
            attention_dropout=training.attention_dropout > 0,
            act_bytes=act_bytes,
            fp8=fp8,
            qkvo=qkvo,
            latent=latent,
        )

    act_layer = formula(rc, f)
    # Backward working set: the layer being back-propagated holds gradient buffers about the size
    # of its full activations (and, under recomputation, its rematerialized activations). Counted
    # once per stage, the same for every recompute level, so recompute never looks worse than none.
    working_layer = formula(np.zeros_like(rc), f)
    act_moe, none_layer, none_moe = act_layer, working_layer, working_layer
    if model.moe is not None:
        r = x.routed
        act_moe = _moe_layer_activations(x, formula, rc)
        none_moe = _moe_layer_activations(x, formula, np.zeros_like(rc))
        # The dispatcher's send and receive buffers of the layer in flight (permuted tokens, h wide).
        working_layer = np.maximum(working_layer, none_moe + 2 * r * h * act_bytes)
    # The bundled entrypoint (the deepspeed runtime's trainer) is dsorch's own, whose layer keeps
    # RoPE's cast tables and the norms' 1/rms beside what the formula counts
    # (memory.entrypoint_extra_bytes_per_layer, measured).
    if x.runtime.bundled_trainer:

        def extra(level):
            return entrypoint_extra_bytes_per_layer(
                s,
                mbs,
                float(model.head_dim),
                tp,
                sp,
                level,
                rmsnorm=model.normalization == "rmsnorm",
                rope=model.position_embedding == "rope",
                act_bytes=act_bytes,
            )

        layer_extra, working_extra = extra(rc), extra(np.zeros_like(rc))
    else:
        layer_extra = working_extra = np.zeros_like(tp)
    return _LayerActivations(
        saved=act_layer + layer_extra,
        saved_moe=act_moe + layer_extra,
        saved_none=none_layer + working_extra,
        saved_moe_none=none_moe + working_extra,
        working=working_layer + working_extra,
        saved_entrypoint=layer_extra,
        working_entrypoint=working_extra,
    )


def _comm_buffers(x: _Inputs) -> np.ndarray:
    """Communication buffers. Megatron's DDP and distributed optimizer reduce in place in their grad
    buffer; DeepSpeed (the runtime's ``own_reduce_buckets``) and Megatron-FSDP have buffers of their own."""
    zero = x.zero_stage
    if x.runtime.own_reduce_buckets:
        bucket_elements = x.runtime.dp_bucket_elements(x.dpc)
        bucket = np.minimum(bucket_elements, x.params_stage) * x.comm_grad_b
        # ZeRO-1/2 keep two reduce buckets (overlap_comm's double buffering); bf16 ZeRO-1 runs in
        # BF16_Optimizer (``whole_grad_allreduce``), which reduces its flat buffer in place and keeps none.
        has_buckets = (zero == 2) | ((zero == 1) & ~x.runtime.whole_grad_allreduce(x.training.precision, zero))
        buffers = np.where(has_buckets, 2 * bucket, 0.0)
        # ZeRO-3 gathers one layer ahead (prefetch) besides the one in use, and with
        # contiguous_gradients allocates its reduce bucket whole at start, whatever the model's size
        # (stage3.py: ipg bucket.buffer = torch.empty(reduce_bucket_size, dtype=grad dtype);
        # measured by train/loop/census.py: 2e8 fp32 elements, 800 MB, on the tiny model).
        gathered = np.minimum(ZERO3_MAX_LIVE_PARAMETERS, 2 * x.layer_params_local) * x.weight_b
        zero3_bucket = bucket_elements * x.weight_b
        return buffers + np.where(zero == 3, gathered + zero3_bucket, 0.0)
    # Megatron-FSDP optim_grads (zero 2): autograd writes each layer's gradient full size in the
    # weights' dtype, which is reduce-scattered into the sharded fp32 main gradient and released
    # after that layer's backward (mfsdp_design.md, "During backward" / "Post-backward"); with
    # the next layer's gradient computed while one is reduced, two layers' worth are live.
    return np.where(zero == 2, 2 * x.layer_params_local * x.weight_b, 0.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class _StageMemory:
    """Bytes per GPU of one pipeline stage (first, a middle one, last), before the buffers and the
    framework, which every stage has alike."""

    params: np.ndarray
    grads: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    entrypoint_activations: np.ndarray  # of the activations, what only dsorch's entrypoint keeps


@dataclass(frozen=True, kw_only=True, slots=True)
class _Memory:
    stack: MemoryStack
    entrypoint_activations: np.ndarray


def _loss_and_pipe_buffers(x: _Inputs) -> tuple[np.ndarray, np.ndarray]:
    """(Bytes of the loss's working set on the last stage, bytes of one micro-batch's stage output
    a pipeline stage keeps) per GPU."""
    model, pp, tp = x.model, x.pp, x.tp
    s, mbs, sp = x.s_local, x.micro_batch_size, x.sequence_parallel
    h, V = float(model.hidden_size), float(model.vocab_size)
    act_bytes = x.act_bytes
    # Loss working set per logit element on the last stage. A cross-entropy that works in place
    # (the runtime's ``in_place_cross_entropy``: Megatron-LM's vocab-parallel one) keeps the 16-bit
    # output plus one fp32 tensor: 2 + 4. PyTorch-side losses (dsorch's entrypoint, train/model/tensor_parallel.py
    # _VocabParallelCrossEntropy; torch's F.cross_entropy on upcast logits as FSDP runs use it)
    # hold the 16-bit logits, the fp32 copy, the shifted logits and exp at once: 2 + 3 x 4. The
    # published torchtitan peaks (Llama 3.1 8B, 2 x 8K tokens, 128K vocabulary) are matched by it.
    loss_bytes = (act_bytes + 4) if x.runtime.in_place_cross_entropy else (act_bytes + 3 * 4)
    logits = s * mbs * V / tp * loss_bytes
    # Pipeline stage outputs: where the runtime frees each sent output (Megatron-LM), nothing beyond
    # the layers' own saved tensors; where it keeps the output of every in-flight micro-batch until
    # that micro-batch's backward (``keeps_pipe_outputs``: DeepSpeed's pipe buffers), 1/tp of it
    # with pipe_partitioned.
    keeps = x.runtime.keeps_pipe_outputs
    out_elems = np.where(sp | keeps, s * mbs * h / tp, s * mbs * h)
    out_buf = np.where(keeps & (pp > 1), out_elems * act_bytes, 0.0)
    return logits, out_buf


def _memory(x: _Inputs) -> _Memory:
    """Bytes per GPU on the binding pipeline stage: the stage whose states and activations are
    largest."""
    model, training, tp, pp, vpp, gas, zero = x.model, x.training, x.tp, x.pp, x.vpp, x.grad_accum_steps, x.zero_stage
    layer = _layer_activations(x)
    logits, out_buf = _loss_and_pipe_buffers(x)

    # Transformer Engine keeps an FP8 copy of each layer weight and of its transpose across the
    # micro-batches of a step (Megatron passes is_first_microbatch, so the casts are cached).
    # With --fp8-param-gather that FP8 weight and its transpose are the only copy (the weight_b bytes
    # already counted): nothing on top.
    fp8_weights = 2.0 * x.layer_params_local if training.fp8 is not None and not training.fp8_param_gather else 0.0
    step_b = x.runtime.step_transient_bytes(training.precision, training.grad_reduce_in_fp32)

    def stage_memory(layers, moe_layers, params_local, experts_local, stage_index, extra_act, outputs=True):
        # The routed experts' states shard over the expert data-parallel group (Megatron's distributed
        # optimizer keeps an expert-dp buffer of its own: core/distributed/distributed_data_parallel.py
        # expert_data_parallel_group; DeepSpeed likewise for MoE parameters).
        w, g, o = model_state_bytes(params_local, x.dpc, zero, x.weight_b, x.grad_b, x.opt_b)
        ew, eg, eo = model_state_bytes(experts_local, x.edp, zero, x.weight_b, x.grad_b, x.opt_b)
        inflight = in_flight_micro_batches(pp, vpp, gas, stage_index)
        # Full recomputation of some layers only (recompute_layers): the others keep everything.
        full, rerun = x.recompute == RECOMPUTE_CODES["full"], x.full_recompute_share(layers)
        dense_kept = np.where(full, rerun * layer.saved + (1 - rerun) * layer.saved_none, layer.saved)
        moe_kept = np.where(full, rerun * layer.saved_moe + (1 - rerun) * layer.saved_moe_none, layer.saved_moe)
        kept = (layers - moe_layers) * dense_kept + moe_layers * moe_kept
        act = kept * inflight + layer.working + extra_act + (out_buf * inflight if outputs else 0.0)
        # The optimizer step's fp32 main-grad copy (runtimes/megatron.MAIN_GRAD_COPY), sharded like the
        # optimizer states, exists once the activations are freed: only what exceeds them adds.
        step = model_state_bytes(params_local, x.dpc, zero, 0.0, 0.0, step_b)[2]
        step = step + model_state_bytes(experts_local, x.edp, zero, 0.0, 0.0, step_b)[2]
        return _StageMemory(
            params=w + ew + layers * fp8_weights,
            grads=g + eg,
            optimizer=o + eo + np.maximum(0.0, step - act),
            activations=act,
            entrypoint_activations=layers * layer.saved_entrypoint * inflight + layer.working_entrypoint,
        )

    # The MTP modules on the last stage: a layer each, and the logits of their own predictions.
    mtp_layers = x.mtp
    mtp_moe = mtp_layers if model.moe is not None else 0.0
    last_logits = logits * (1.0 + mtp_layers) if mtp_layers else logits
    stages = (
        stage_memory(
            x.lf + np.where(pp == 1, mtp_layers, 0.0),
            x.moe_first + np.where(pp == 1, mtp_moe, 0.0),
            x.first_params,
            x.expert_first,
            0.0,
            np.where(pp == 1, last_logits, 0.0),
        ),
        stage_memory(x.lm, x.moe_middle, x.middle_params, x.expert_middle, np.minimum(1.0, pp - 1), 0.0),
        stage_memory(
            x.ll + mtp_layers, x.moe_last + mtp_moe, x.last_params, x.expert_last, pp - 1, last_logits, outputs=False
        ),
    )
    buffers = _comm_buffers(x)
    framework = np.full_like(tp, x.profile.memory_overhead_gib * GIB)

    totals = [st.params + st.grads + st.optimizer + st.activations for st in stages]
    which = np.argmax(np.stack(totals), axis=0)
    pick = lambda name: np.choose(which, [getattr(st, name) for st in stages])  # noqa: E731
    params_b, grads_b, opt_bytes, act_b = pick("params"), pick("grads"), pick("optimizer"), pick("activations")
    total = params_b + grads_b + opt_bytes + act_b + (framework + buffers)
    return _Memory(
        stack=MemoryStack(
            params=params_b,
            grads=grads_b,
            optimizer=opt_bytes,
            activations=act_b,
            comm_buffers=buffers,
            framework=framework,
            total=total,
        ),
        entrypoint_activations=pick("entrypoint_activations"),
    )
