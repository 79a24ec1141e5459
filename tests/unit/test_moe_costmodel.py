"""The cost model's mixture-of-experts terms: each one moves the way its source says it does, and
a dense model is untouched by them (the golden plans check the latter byte for byte)."""

from __future__ import annotations

import pytest

from orchestrator.costmodel import evaluate
from orchestrator.costmodel.flops import model_flops_per_step
from orchestrator.plan.layout import Layout
from orchestrator.plan.solver import candidates_of
from orchestrator.spec.cluster import load_profile
from orchestrator.spec.model import ModelSpec
from orchestrator.spec.training import TrainingSpec

MIXTRAL = ModelSpec(
    num_layers=32,
    hidden_size=4096,
    ffn_hidden_size=14336,
    num_attention_heads=32,
    num_kv_heads=8,
    vocab_size=32000,
    moe=dict(num_experts=8, top_k=2, ffn_hidden_size=14336),
)
DSV3 = ModelSpec(
    num_layers=61,
    hidden_size=7168,
    ffn_hidden_size=18432,
    num_attention_heads=128,
    vocab_size=129280,
    mla=dict(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
    moe=dict(
        num_experts=256,
        top_k=8,
        ffn_hidden_size=2048,
        shared_experts=1,
        dense_leading_layers=3,
        router="sigmoid",
        groups=8,
        group_top_k=4,
        expert_bias=True,
    ),
    mtp_layers=1,
)
TRAIN = TrainingSpec(seq_length=4096, global_batch_size=256, steps=100, optimizer=dict(warmup_steps=10))


def _layout(**kw) -> Layout:
    base = dict(
        tp=1,
        pp=1,
        dp=64,
        vpp=1,
        zero_stage=1,
        micro_batch_size=1,
        grad_accum_steps=4,
        recompute="none",
        sequence_parallel=False,
        cp=1,
        ep=1,
        etp=1,
    )
    return Layout(**{**base, **kw})


def _eval(model, layouts, profile=None, training=TRAIN, runtime="megatron"):
    profile = profile or load_profile("dgx16").profile.resized(nodes=8)
    return evaluate(model, training, profile, runtime, candidates_of(model, layouts))


def test_the_flop_count_is_megatrons_for_mixtral():
    # Megatron-LM core_r0.9.0 num_floating_point_operations for one 4096-token Mixtral 8x7B sequence
    # (padded vocab 32000, top-2, SwiGLU), as ../shared/reference/calibration_runs_moe.yaml states it;
    # dsorch also counts the router's h x E GEMM, which Megatron's formula leaves out (1e-4 of it).
    assert model_flops_per_step(MIXTRAL, 4096, 1) == pytest.approx(3.3967e14, rel=2e-4)


def test_experts_split_over_ep_and_their_optimizer_over_the_expert_data_parallel_group():
    ev = _eval(MIXTRAL, [_layout(ep=1), _layout(ep=2), _layout(ep=8)])
    experts = MIXTRAL.num_moe_layers * MIXTRAL.moe.num_experts * MIXTRAL.expert_params
    dense = MIXTRAL.num_params - experts
    # bf16 weights on Megatron-LM: 2 bytes per parameter, the experts' over ep.
    for i, ep in enumerate((1, 2, 8)):
        assert ev.memory.params[i] == pytest.approx(2 * (dense + experts / ep))
        # Distributed optimizer: 12 bytes per parameter over dp (dense) or dp / ep (experts).
        assert ev.memory.optimizer[i] == pytest.approx(12 * (dense / 64 + experts / ep / (64 / ep)))


def test_all_to_all_is_zero_without_ep_and_cheaper_inside_an_nvlink_domain():
    ev = _eval(MIXTRAL, [_layout(ep=1), _layout(ep=8), _layout(ep=8, tp=2, dp=32, sequence_parallel=True)])
    assert ev.time.ep_comm[0] == 0 and ev.time.ep_comm[1] > 0
    # DeepSeek-V3 at ep 64: across eight 8-GPU nodes the all-to-all goes over InfiniBand; inside one
    # 72-GPU NVLink domain over NVLink.
    dgx = load_profile("dgx16").profile.resized(nodes=16)
    nvl = dgx.model_copy(
        update={"gpus_per_node": 4, "nodes": 32, "intra_node": dgx.intra_node.model_copy(update={"domain_gpus": 64})}
    )
    L = _layout(ep=64, pp=2, dp=64, grad_accum_steps=2, micro_batch_size=2)
    t = TrainingSpec(seq_length=4096, global_batch_size=256, steps=100, optimizer=dict(warmup_steps=10))
    across = _eval(DSV3, [L], dgx, t).time.ep_comm[0]
    inside = _eval(DSV3, [L], nvl, t).time.ep_comm[0]
    assert inside < across / 3


def test_deepep_sends_a_token_once_per_remote_domain():
    dgx = load_profile("dgx16").profile.resized(nodes=16)
    L = _layout(ep=64, pp=2, dp=64, grad_accum_steps=2, micro_batch_size=2)
    plain = _eval(DSV3, [L], dgx).time.ep_comm[0]
    flex = _eval(DSV3, [L], dgx, TRAIN.model_copy(update={"moe_dispatcher": "flex"})).time.ep_comm[0]
    assert flex < plain


def test_imbalance_slows_the_experts_and_overlap_hides_the_all_to_all():
    L = [_layout(ep=8)]
    base = _eval(MIXTRAL, L)
    skew = _eval(MIXTRAL, L, training=TRAIN.model_copy(update={"moe_load_imbalance": 1.5}))
    assert skew.time.compute[0] > base.time.compute[0] and skew.time.ep_comm[0] > base.time.ep_comm[0]
    hid = _eval(MIXTRAL, L, training=TRAIN.model_copy(update={"moe_overlap_ep_comm": True}))
    assert hid.time.ep_comm[0] < base.time.ep_comm[0]


def test_permuted_tokens_are_top_k_copies_of_the_activations():
    one = MIXTRAL.model_copy(update={"moe": MIXTRAL.moe.model_copy(update={"top_k": 1})})
    a1 = _eval(one, [_layout(ep=8)]).memory.activations[0]
    a2 = _eval(MIXTRAL, [_layout(ep=8)]).memory.activations[0]
    assert a2 > a1 * 1.3
