"""Megatron-LM flags of mixture-of-experts, multi-latent-attention and GPT-OSS plans, and dsorch's checks of them.

The model specs below are written from the published config.json files (values quoted in each); the layouts are
set by hand, as a pinned plan would have them. Each plan's flags must pass dsorch's Megatron table check (always)
and, in tests/system/test_megatron_lm.py with $MEGATRON_LM set, Megatron-LM's own parse_args, validate_args and
TransformerConfig (the same CASES)."""

from __future__ import annotations

import ast
from types import SimpleNamespace

import pytest

from orchestrator.plan.decisions import decide
from orchestrator.plan.layout import Layout
from orchestrator.plan.rules import check_layout, check_model, stage_split
from orchestrator.render.megatron import (
    megatron_flags,
    moe_layer_freq,
    pipeline_layout,
    render_megatron_args,
)
from orchestrator.runtimes import MEGATRON, runtime_named
from orchestrator.spec.cluster import Features, load_profile
from orchestrator.spec.model import ModelSpec, SpecFile
from orchestrator.validate.megatron import check_megatron_args, check_pretrain_needs, parse_args_lines
from orchestrator.validate.megatron_parallel import layout_stages

TRAINING = {"seq_length": 4096, "global_batch_size": 1024, "steps": 1000, "optimizer": {"warmup_steps": 100}}

# deepseek-ai/DeepSeek-V3 config.json: hidden_size 7168, intermediate_size 18432, moe_intermediate_size 2048,
# num_hidden_layers 61, num_attention_heads 128, n_routed_experts 256, n_shared_experts 1, num_experts_per_tok 8,
# first_k_dense_replace 3, scoring_func sigmoid, norm_topk_prob true, n_group 8, topk_group 4,
# routed_scaling_factor 2.5, q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64,
# v_head_dim 128, vocab_size 129280, num_nextn_predict_layers 1; seq_aux and aux-loss-free bias (report Sec. 2.1.2).
DEEPSEEK_V3 = {
    "num_layers": 61, "hidden_size": 7168, "ffn_hidden_size": 18432, "num_attention_heads": 128,
    "vocab_size": 129280, "max_position_embeddings": 163840, "rope_theta": 10000, "mtp_layers": 1,
    "mla": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
            "v_head_dim": 128},
    "moe": {"num_experts": 256, "top_k": 8, "ffn_hidden_size": 2048, "shared_experts": 1, "dense_leading_layers": 3,
            "router": "sigmoid", "groups": 8, "group_top_k": 4, "scale": 2.5, "load_balancing": "seq_aux_loss",
            "aux_loss_coeff": 0.0001, "expert_bias": True},
}
# mistralai/Mixtral-8x7B-v0.1 config.json: hidden 4096, intermediate 14336, 32 layers, 32 heads, 8 kv heads,
# num_local_experts 8, num_experts_per_tok 2, router_aux_loss_coef 0.02, vocab 32000, rope_theta 1e6.
MIXTRAL = {
    "num_layers": 32, "hidden_size": 4096, "ffn_hidden_size": 14336, "num_attention_heads": 32, "num_kv_heads": 8,
    "vocab_size": 32000, "max_position_embeddings": 32768, "rope_theta": 1000000,
    "moe": {"num_experts": 8, "top_k": 2, "ffn_hidden_size": 14336, "aux_loss_coeff": 0.02},
}
# openai/gpt-oss-120b config.json: hidden 2880, intermediate 2880, 36 layers, 64 heads, 8 kv heads, head_dim 64,
# num_local_experts 128, experts_per_token 4, sliding_window 128 on alternate layers (layer_types), attention_bias,
# swiglu_limit 7.0, vocab 201088, rope_theta 150000; sinks, biased experts and router (modeling_gpt_oss.py).
GPT_OSS_120B = {
    "num_layers": 36, "hidden_size": 2880, "ffn_hidden_size": 2880, "num_attention_heads": 64, "num_kv_heads": 8,
    "kv_channels": 64, "vocab_size": 201088, "max_position_embeddings": 131072, "rope_theta": 150000, "bias": True,
    "activation": "quick_geglu", "activation_clamp": 7.0, "glu_linear_offset": 1.0, "sliding_window": 128,
    "global_attention_every": 2, "attention_sinks": True,
    "moe": {"num_experts": 128, "top_k": 4, "ffn_hidden_size": 2880},
}
# Qwen/Qwen3-30B-A3B config.json: hidden 2048, intermediate 6144, moe_intermediate_size 768, 48 layers, 32 heads,
# 4 kv heads, head_dim 128, 128 experts, 8 per token, norm_topk_prob true, vocab 151936, QK-norm.
QWEN3_30B_A3B = {
    "num_layers": 48, "hidden_size": 2048, "ffn_hidden_size": 6144, "num_attention_heads": 32, "num_kv_heads": 4,
    "kv_channels": 128, "qk_norm": True, "vocab_size": 151936, "max_position_embeddings": 40960,
    "rope_theta": 1000000, "moe": {"num_experts": 128, "top_k": 8, "ffn_hidden_size": 768, "aux_loss_coeff": 0.001},
}
# Qwen/Qwen1.5-MoE-A2.7B config.json: hidden 2048, 24 layers, 16 heads, 60 experts, 4 per token,
# moe_intermediate_size 1408, shared_expert_intermediate_size 5632 with its sigmoid gate, norm_topk_prob false,
# QKV biases, vocab 151936.
QWEN15_MOE = {
    "num_layers": 24, "hidden_size": 2048, "ffn_hidden_size": 5632, "num_attention_heads": 16, "qkv_bias": True,
    "vocab_size": 151936, "max_position_embeddings": 8192, "rope_theta": 1000000,
    "moe": {"num_experts": 60, "top_k": 4, "ffn_hidden_size": 1408, "shared_experts": 4,
            "shared_ffn_hidden_size": 5632, "shared_expert_gate": True, "norm_top_k": False},
}


def _layout(*, tp=1, pp=1, dp, vpp=1, ep=1, etp=1, gas=None, sp=False, recompute="none"):
    gas = gas or TRAINING["global_batch_size"] // dp
    return Layout(tp=tp, pp=pp, dp=dp, vpp=vpp, zero_stage=1, micro_batch_size=1, grad_accum_steps=gas,
                  recompute=recompute, sequence_parallel=sp, cp=1, ep=ep, etp=etp)


# name: (model, training changes, layout), as a pinned plan would have them.
CASES = {
    "deepseek-v3-tp1-pp8-vpp4-ep32": (DEEPSEEK_V3, {}, _layout(pp=8, vpp=4, dp=32, ep=32)),
    "deepseek-v3-tp1-pp7-vpp3-ep32": (DEEPSEEK_V3 | {"mtp_layers": 0}, {"global_batch_size": 4032},
                                      _layout(pp=7, vpp=3, dp=64, ep=32, gas=63)),
    "mixtral-8x7b-tp1-pp4-vpp8-ep8": (MIXTRAL, {}, _layout(pp=4, vpp=8, dp=64, ep=8)),
    "mixtral-8x7b-tp2-sp-ep4-overlap": (MIXTRAL, {"moe_overlap_ep_comm": True},
                                        _layout(tp=2, pp=2, vpp=2, dp=64, ep=4, sp=True, recompute="selective")),
    "gpt-oss-120b-tp1-ep64": (GPT_OSS_120B, {}, _layout(dp=128, ep=64)),
    "qwen3-30b-a3b-tp2-sp-ep8": (QWEN3_30B_A3B, {}, _layout(tp=2, dp=64, ep=8, sp=True)),
    "qwen1.5-moe-tp1-ep4-capacity": (QWEN15_MOE | {"moe": QWEN15_MOE["moe"] | {"capacity_factor": 1.25}}, {},
                                     _layout(dp=32, ep=4)),
}


def case_spec(model: dict, training: dict | None = None) -> SpecFile:
    return SpecFile.model_validate(
        {"name": "t", "source": "test", "model": model, "training": TRAINING | (training or {})})


# A stand-in for Plan.checkpoint (plan/make.py; tests/unit/test_checkpoint_interval.py tests it):
# these tests check the other flags, so the interval is fixed.
CHECKPOINT = SimpleNamespace(steps=1000)


def case_plan(name: str, runtime: str = "megatron", deepep: bool = False):
    """A stand-in for a Plan: what megatron_flags reads (spec, layout, runtime, profile, decisions)."""
    model, training, layout = CASES[name]
    profile = load_profile("dgx16").profile
    if deepep:
        profile = profile.model_copy(update={"features": Features(deepep=True)})
    spec = case_spec(model, training)
    return SimpleNamespace(spec=spec, layout=layout, runtime=runtime_named(runtime), profile=profile, checkpoint=CHECKPOINT,
                           decisions=decide(spec, profile, runtime, layout))


def _flags(plan) -> dict[str, str | None]:
    return dict(megatron_flags(plan))


# --------------------------------------------------------------------------- the planned flags pass the table


@pytest.mark.parametrize("runtime", ["megatron", "deepspeed"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_moe_plans_pass_the_megatron_table_check(name, runtime):
    plan = case_plan(name, runtime)
    text = render_megatron_args(plan)
    flags = parse_args_lines(text)
    assert flags == [(k, v) for k, v in megatron_flags(plan)]  # one flag per line, values without spaces
    L = plan.layout
    assert check_megatron_args(flags, L.world_size) == []
    if runtime == "megatron":
        assert check_pretrain_needs(flags) == []
    assert check_model(plan.spec.model, runtime) == []


def test_deepseek_v3_flags():
    f = _flags(case_plan("deepseek-v3-tp1-pp8-vpp4-ep32"))
    assert f["--expert-model-parallel-size"] == "32" and f["--expert-tensor-parallel-size"] == "1"
    assert f["--num-experts"] == "256" and f["--moe-router-topk"] == "8"
    assert f["--moe-layer-freq"] == "[0]*3+[1]*58"
    assert f["--moe-ffn-hidden-size"] == "2048" and f["--moe-shared-expert-intermediate-size"] == "2048"
    assert f["--ffn-hidden-size"] == "18432"  # the three dense leading layers
    assert f["--moe-router-score-function"] == "sigmoid" and "--moe-router-pre-softmax" not in f
    assert (f["--moe-router-num-groups"], f["--moe-router-group-topk"]) == ("8", "4")
    assert f["--moe-router-topk-scaling-factor"] == "2.5"
    assert f["--moe-router-load-balancing-type"] == "seq_aux_loss" and f["--moe-aux-loss-coeff"] == "0.0001"
    assert "--moe-router-enable-expert-bias" in f and "--moe-expert-capacity-factor" not in f  # dropless
    assert "--multi-latent-attention" in f and "--qk-layernorm" in f  # MLA's latent RMSNorms
    assert (f["--q-lora-rank"], f["--kv-lora-rank"]) == ("1536", "512")
    assert (f["--qk-head-dim"], f["--qk-pos-emb-head-dim"], f["--v-head-dim"]) == ("128", "64", "128")
    assert "--kv-channels" not in f and "--group-query-attention" not in f  # 7168 / 128 heads divides
    assert f["--mtp-num-layers"] == "1"
    assert f["--moe-token-dispatcher-type"] == "alltoall" and "--moe-grouped-gemm" in f
    assert f["--moe-router-dtype"] == "fp32"
    assert f["--transformer-impl"] == "transformer_engine"
    assert "--overlap-moe-expert-parallel-comm" not in f  # not asked for
    # 61 layers, the MTP module, the embedding and the loss over 8 x 4 virtual stages: Megatron-Bridge's own layout.
    assert f["--pipeline-model-parallel-layout"] == "Et|(tt|)*30mL"
    assert not {"--num-layers-per-virtual-pipeline-stage", "--account-for-loss-in-pipeline-split"} & set(f)
    # Without MTP the same model splits by Megatron's own counting.
    g = _flags(case_plan("deepseek-v3-tp1-pp7-vpp3-ep32"))
    assert g["--num-layers-per-virtual-pipeline-stage"] == "3" and "--account-for-loss-in-pipeline-split" in g
    assert "--pipeline-model-parallel-layout" not in g and "--mtp-num-layers" not in g


@pytest.mark.parametrize("layers, mtp, pp, vpp", [(61, 1, 8, 4), (61, 1, 8, 1), (61, 1, 8, 2), (61, 1, 4, 1),
                                                  (63, 1, 8, 2), (61, 1, 2, 1), (30, 2, 4, 2), (16, 2, 2, 2),
                                                  (61, 0, 8, 4), (61, 0, 2, 4)])
def test_pipeline_layout_places_the_split_dsorch_planned(layers, mtp, pp, vpp):
    split = stage_split(layers, pp, mtp)
    text = pipeline_layout(layers, mtp, pp, vpp, split.kind)
    assert " " not in text
    stages = layout_stages(text)  # Megatron's parse_str_to_list, as validate/megatron_parallel.py reproduces it
    assert len(stages) == pp * vpp
    per_rank = [[stages[v * pp + r] for v in range(vpp)] for r in range(pp)]
    layers_of = [sum(chunk.count("t") for chunk in rank) for rank in per_rank]
    assert layers_of == [split.first] + [split.middle] * (pp - 2) + [split.last]
    assert per_rank[-1][-1].endswith("m" * mtp + "L") and per_rank[0][0].startswith("E")
    assert sum(layers_of) == layers
    flags = [("--num-layers", str(layers)), ("--pipeline-model-parallel-size", str(pp)),
             ("--mtp-num-layers", str(mtp)), ("--pipeline-model-parallel-layout", text)]
    assert not [e for e in check_megatron_args(flags, pp * 8) if "layout" in e]


def test_mixtral_flags_and_the_deepspeed_runtime_keeps_only_the_model():
    f = _flags(case_plan("mixtral-8x7b-tp1-pp4-vpp8-ep8"))
    assert f["--num-experts"] == "8" and f["--moe-router-topk"] == "2" and f["--moe-layer-freq"] == "1"
    assert f["--moe-router-score-function"] == "softmax" and "--moe-router-pre-softmax" not in f  # renormalized
    assert f["--moe-aux-loss-coeff"] == "0.02" and f["--moe-router-load-balancing-type"] == "aux_loss"
    assert "--moe-shared-expert-intermediate-size" not in f and "--moe-router-num-groups" not in f
    assert "--multi-latent-attention" not in f and "--qk-layernorm" not in f
    d = _flags(case_plan("mixtral-8x7b-tp1-pp4-vpp8-ep8", "deepspeed"))
    engine = {"--moe-token-dispatcher-type", "--moe-grouped-gemm", "--overlap-moe-expert-parallel-comm",
              "--moe-flex-dispatcher-backend", "--transformer-impl", "--moe-router-dtype"}
    assert not engine & set(d)
    assert {k: v for k, v in f.items() if k not in engine and k in d} == {k: v for k, v in d.items() if k in f}


def test_ep_overlap_is_emitted_where_megatron_accepts_it():
    plan = case_plan("mixtral-8x7b-tp2-sp-ep4-overlap")
    assert "--overlap-moe-expert-parallel-comm" in _flags(plan)
    # Without interleaving under a pipeline, or with full recomputation, Megatron refuses it: not emitted.
    for change in ({"vpp": 1}, {"recompute": "full"}, {"ep": 1}):
        layout = _layout(**({"tp": 2, "pp": 2, "vpp": 2, "dp": 64, "ep": 4, "sp": True} | change))
        other = SimpleNamespace(**vars(plan) | {"layout": layout,
                                                "decisions": decide(plan.spec, plan.profile, plan.runtime, layout)})
        assert "--overlap-moe-expert-parallel-comm" not in _flags(other), change


def test_gpt_oss_flags():
    f = _flags(case_plan("gpt-oss-120b-tp1-ep64"))
    assert f["--kv-channels"] == "64" and f["--num-query-groups"] == "8"
    assert f["--window-size"] == "127,0" and f["--window-attn-skip-freq"] == "2"
    assert f["--softmax-type"] == "learnable"
    assert "--quick-geglu" in f and "--swiglu" not in f
    assert "--no-bias-gelu-fusion" not in f  # every MLP is an expert, whose grouped MLP fuses quick-GeGLU
    assert f["--activation-func-clamp-value"] == "7.0" and f["--glu-linear-offset"] == "1.0"
    assert "--disable-bias-linear" not in f  # biased linears, routers and experts
    assert f["--expert-model-parallel-size"] == "64"


def test_qwen_flags():
    f = _flags(case_plan("qwen3-30b-a3b-tp2-sp-ep8"))
    assert f["--kv-channels"] == "128" and "--qk-layernorm" in f and "--sequence-parallel" in f
    assert f["--moe-ffn-hidden-size"] == "768" and f["--expert-tensor-parallel-size"] == "1"
    q = _flags(case_plan("qwen1.5-moe-tp1-ep4-capacity"))
    assert "--moe-router-pre-softmax" in q  # norm_topk_prob false: the top-k of a softmax over all experts
    assert q["--moe-shared-expert-intermediate-size"] == "5632" and "--moe-shared-expert-gate" in q
    assert q["--moe-expert-capacity-factor"] == "1.25" and "--moe-pad-expert-input-to-capacity" not in q
    assert "--add-qkv-bias" in q and "--disable-bias-linear" in q


def test_dispatcher_follows_the_profile_and_the_spec():
    plan = case_plan("mixtral-8x7b-tp1-pp4-vpp8-ep8", deepep=True)
    f = _flags(plan)
    assert f["--moe-token-dispatcher-type"] == "flex" and f["--moe-flex-dispatcher-backend"] == "deepep"
    assert check_megatron_args(list(megatron_flags(plan)), plan.layout.world_size) == []
    # One expert-parallel rank: nothing to dispatch, DeepEP refuses it (TPxEP > 1), alltoall it is.
    one = _layout(pp=4, vpp=8, dp=64, ep=1)
    assert decide(plan.spec, plan.profile, plan.runtime, one).dispatcher == "alltoall"
    asked = case_spec(MIXTRAL, {"moe_dispatcher": "allgather"})
    assert decide(asked, plan.profile, plan.runtime, plan.layout).dispatcher == "allgather"
    assert "--moe-token-dispatcher-type" not in _flags(case_plan("mixtral-8x7b-tp1-pp4-vpp8-ep8", "deepspeed", True))


def test_dense_plans_carry_no_moe_flags():
    spec = case_spec({k: v for k, v in MIXTRAL.items() if k != "moe"})
    plan = SimpleNamespace(spec=spec, layout=_layout(pp=4, vpp=8, dp=64), runtime=MEGATRON,
                           profile=load_profile("dgx16").profile, checkpoint=CHECKPOINT)
    f = _flags(plan)
    assert not [k for k in f if "moe" in k or "expert" in k or k in ("--num-experts", "--mtp-num-layers")]


# --------------------------------------------------------------------------- --moe-layer-freq


@pytest.mark.parametrize("layers, dense, freq", [(61, 3, 1), (27, 1, 1), (48, 0, 2), (40, 2, 3), (41, 2, 3),
                                                 (12, 5, 4), (10, 9, 1), (9, 1, 8)])
def test_moe_layer_freq_is_the_spec_pattern(layers, dense, freq):
    model = ModelSpec.model_validate(MIXTRAL | {"num_layers": layers, "moe": MIXTRAL["moe"] | {
        "dense_leading_layers": dense, "layer_freq": freq}})
    value = moe_layer_freq(model)
    want = [int(model.is_moe_layer(i)) for i in range(layers)]
    if isinstance(value, int):
        # gpt_layer_specs.py: layer i is MoE when i % moe_layer_freq == 0
        assert dense == 0 and [int(i % value == 0) for i in range(layers)] == want
        return
    assert " " not in value and set(value) <= set("0123456789[]()+*")  # arguments.py _eval_pattern
    assert _literal_eval_pattern(value) == want
    flags = [("--num-layers", str(layers)), ("--num-experts", "8"), ("--moe-layer-freq", value)]
    assert not [e for e in check_megatron_args(flags, 8) if "moe-layer-freq" in e]


def _literal_eval_pattern(text: str) -> list[int]:
    """Evaluate the list expression as Python does (Megatron eval()s it), through the AST."""
    def ev(node):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.List):
            return [ev(e) for e in node.elts]
        assert isinstance(node, ast.BinOp)
        a, b = ev(node.left), ev(node.right)
        return a + b if isinstance(node.op, ast.Add) else a * b
    return ev(ast.parse(text, mode="eval").body)


# --------------------------------------------------------------------------- the table check's MoE rules


def _base() -> list[tuple[str, str | None]]:
    return list(megatron_flags(case_plan("mixtral-8x7b-tp1-pp4-vpp8-ep8")))


def _edit(flags, **changes):
    """Flags with some changed (key=value), added (value None: a switch) or dropped (value False)."""
    for key, value in changes.items():
        flag = "--" + key.replace("_", "-")
        flags = [(f, v) for f, v in flags if f != flag] + ([] if value is False else [(flag, value)])
    return flags


def _errors(world=256, **changes):
    return check_megatron_args(_edit(_base(), **changes), world)


def test_the_base_moe_flags_are_valid():
    assert _errors() == []


@pytest.mark.parametrize("changes, world, needles", [
    ({"expert_model_parallel_size": "3"}, 256, ["--num-experts 8 is not divisible by --expert-model-parallel-size 3"]),
    ({"expert_model_parallel_size": "8", "expert_tensor_parallel_size": "3"}, 256,
     ["world size 256 is not divisible by --expert-tensor-parallel-size 3 x --expert-model-parallel-size 8 x "
      "--pipeline-model-parallel-size 4 = 96", "choose etp x ep dividing 64"]),
    ({"expert_model_parallel_size": "0"}, 256, ["--expert-model-parallel-size 0 must be at least 1"]),
    ({"num_experts": False, "moe_router_topk": False, "moe_layer_freq": False, "moe_ffn_hidden_size": False,
      "moe_router_score_function": False, "moe_router_load_balancing_type": False, "moe_aux_loss_coeff": False,
      "moe_token_dispatcher_type": False, "moe_grouped_gemm": False, "expert_tensor_parallel_size": False}, 256,
     ["--expert-model-parallel-size 8 splits experts and there are none"]),
    ({"num_experts": False}, 256, ["--moe-router-topk has no effect without --num-experts"]),
    ({"disable_bias_linear": False, "expert_tensor_parallel_size": "2", "expert_model_parallel_size": "4"}, 256,
     ["in the experts need --expert-tensor-parallel-size 1"]),
    ({"moe_layer_freq": "[0]*3+[1]*30"}, 256, ["--moe-layer-freq lists 33 layers but --num-layers is 32"]),
    ({"moe_layer_freq": "[0]*2+[2]*30"}, 256, ["--moe-layer-freq may hold only 0 (dense layer) and 1 (MoE layer)"]),
    ({"moe_layer_freq": "0"}, 256, ["--moe-layer-freq 0 must be at least 1"]),
    ({"moe_layer_freq": "[0]**3"}, 256, ["--moe-layer-freq expects an integer or a list expression"]),
    ({"moe_layer_freq": "__import__('os')"}, 256, ["--moe-layer-freq expects an integer or a list expression"]),
    ({"moe_layer_freq": "[1]*10000000"}, 256, ["--moe-layer-freq expects an integer or a list expression"]),
    ({"moe_shared_expert_gate": None}, 256,
     ["--moe-shared-expert-gate has no effect without --moe-shared-expert-intermediate-size"]),
    ({"moe_shared_expert_intermediate_size": "4096", "disable_bias_linear": False}, 256,
     ["shared experts take no biases in Megatron-Core"]),
    ({"moe_shared_expert_intermediate_size": "4096", "moe_shared_expert_overlap": None,
      "moe_token_dispatcher_type": "allgather"}, 256, ["--moe-shared-expert-overlap overlaps the shared experts"]),
    ({"moe_router_topk": "9"}, 256, ["--moe-router-topk 9 must be between 1 and --num-experts 8"]),
    ({"moe_router_topk": "1"}, 256, ["--moe-router-topk 1 with the softmax router needs --moe-router-pre-softmax"]),
    ({"moe_router_score_function": "sigmoid", "moe_router_pre_softmax": None}, 256,
     ["--moe-router-pre-softmax has no effect with --moe-router-score-function sigmoid"]),
    ({"moe_router_group_topk": "2"}, 256, ["--moe-router-group-topk needs --moe-router-num-groups"]),
    ({"moe_router_num_groups": "3", "moe_router_group_topk": "2"}, 256,
     ["--num-experts 8 is not divisible by --moe-router-num-groups 3"]),
    ({"moe_router_num_groups": "4", "moe_router_group_topk": "5"}, 256,
     ["--moe-router-group-topk 5 is above --moe-router-num-groups 4"]),
    ({"moe_router_num_groups": "4"}, 256, ["--moe-router-num-groups has no effect without --moe-router-group-topk"]),
    ({"moe_router_enable_expert_bias": None}, 256,
     ["--moe-router-enable-expert-bias (auxiliary-loss-free balancing) works with the sigmoid"]),
    ({"moe_router_load_balancing_type": "aux_loss seq_aux_loss"}, 256,
     ["--moe-router-load-balancing-type lists 2 types: give --moe-aux-loss-coeff one coefficient for each"]),
    ({"moe_expert_capacity_factor": "-1.0"}, 256, ["--moe-expert-capacity-factor -1.0 is negative"]),
    ({"moe_expert_capacity_factor": "1.0", "moe_router_load_balancing_type": "sinkhorn"}, 256,
     ["--moe-expert-capacity-factor works with the load-balancing types aux_loss"]),
    ({"moe_pad_expert_input_to_capacity": None}, 256, ["--moe-pad-expert-input-to-capacity needs --moe-expert"]),
    ({"moe_flex_dispatcher_backend": "deepep"}, 256, ["--moe-flex-dispatcher-backend needs --moe-token-dispatcher"]),
    ({"moe_token_dispatcher_type": "flex", "expert_model_parallel_size": "1"}, 256,
     ["the flex dispatcher (deepep) sends tokens over the expert-TP x EP group, here 1 rank"]),
    ({"moe_token_dispatcher_type": "flex", "moe_expert_capacity_factor": "1.0",
      "moe_pad_expert_input_to_capacity": None}, 256, ["DeepEP does not pad to capacity"]),
    ({"overlap_moe_expert_parallel_comm": None, "num_layers_per_virtual_pipeline_stage": False}, 256,
     ["--overlap-moe-expert-parallel-comm needs the interleaved schedule"]),
    ({"overlap_moe_expert_parallel_comm": None, "moe_token_dispatcher_type": "allgather"}, 256,
     ["--overlap-moe-expert-parallel-comm needs --moe-token-dispatcher-type alltoall or flex"]),
    ({"overlap_moe_expert_parallel_comm": None, "recompute_granularity": "full", "recompute_method": "uniform",
      "recompute_num_layers": "1"}, 256, ["--overlap-moe-expert-parallel-comm needs no full recomputation"]),
    ({"overlap_moe_expert_parallel_comm": None, "bf16": False}, 256,
     ["--overlap-moe-expert-parallel-comm needs --bf16 or --fp16"]),
    ({"overlap_moe_expert_parallel_comm": None, "mtp_num_layers": "2"}, 256,
     ["--overlap-moe-expert-parallel-comm needs at most one MTP layer"]),
    ({"overlap_moe_expert_parallel_comm": None, "expert_model_parallel_size": "1"}, 256,
     ["--overlap-moe-expert-parallel-comm needs --expert-model-parallel-size > 1"]),
])
def test_moe_rules(changes, world, needles):
    errors = _errors(world, **changes)
    assert [e for e in errors if all(n in e for n in needles)], errors


@pytest.mark.parametrize("changes, needles", [
    ({"kv_lora_rank": "512"}, ["--kv-lora-rank has no effect without --multi-latent-attention"]),
    ({"multi_latent_attention": None}, ["--multi-latent-attention and --group-query-attention are mutually"]),
    ({"multi_latent_attention": None, "group_query_attention": False, "num_query_groups": False,
      "rope_type": "rope"}, ["--rope-type rope with --multi-latent-attention needs --no-rope-fusion"]),
    ({"multi_latent_attention": None, "group_query_attention": False, "num_query_groups": False,
      "rotary_interleaved": None}, ["--rotary-interleaved does not work with --multi-latent-attention"]),
    ({"window_attn_skip_freq": "2"}, ["--window-attn-skip-freq has no effect without --window-size"]),
    ({"window_size": "127"}, ["--window-size takes the window's left and right extent"]),
    ({"window_size": "a,b"}, ["--window-size expects comma-separated integers such as 127,0"]),
    ({"window_size": "127,0", "window_attn_skip_freq": "[0,1]*8"},
     ["--window-attn-skip-freq lists 16 layers but --num-layers is 32"]),
    ({"quick_geglu": None}, ["--swiglu and --quick-geglu are two activations"]),

    ({"swiglu": False, "quick_geglu": None, "moe_layer_freq": "2"},
     ["--quick-geglu in a dense MLP (or shared experts) needs --no-bias-gelu-fusion"]),
    ({"activation_func_clamp_value": "-1"}, ["--activation-func-clamp-value -1.0 must be finite and positive"]),
    ({"activation_func_clamp_value": "7", "glu_linear_offset": "1"},
     ["--glu-linear-offset must be 0 when --swiglu is clamped"]),
    ({"glu_linear_offset": "1"}, ["--glu-linear-offset 1.0 needs --quick-geglu with the fused bias-activation"]),
])
def test_attention_and_activation_rules(changes, needles):
    errors = _errors(**changes)
    assert [e for e in errors if all(n in e for n in needles)], errors


@pytest.mark.parametrize("layout, needle", [
    ("Et*8|(t*8|)*2t*8L", None),  # Mixtral's 32 layers over 4 stages, no interleaving
    ("Et*8|(t*8|)*2t*7L", "--pipeline-model-parallel-layout places 31 layers (t) but --num-layers is 32"),
    ("Et*8|(t*8|)*2t*8mL", "places 1 MTP modules (m) but --mtp-num-layers is 0"),
    ("t*8|(t*8|)*2Et*8L", "must start with the embedding (E) and end with the loss (L), once each"),
    ("Et*8|(t*8|)*1t*16L", "has 3 stages, not a multiple of --pipeline-model-parallel-size 4"),
    ("Et*8|(t*8|)*2x*8L", "may hold only E (embedding), t (layer), m (MTP), L (loss)"),
    ("E(t|)*99999999L", "may hold only E (embedding)"),
])
def test_layout_rules(layout, needle):
    flags = _edit(_base(), num_layers_per_virtual_pipeline_stage=False, pipeline_model_parallel_layout=layout)
    errors = check_megatron_args(flags, 256)
    if needle is None:
        assert errors == []
    else:
        assert [e for e in errors if needle in e], errors
    both = _edit(flags, account_for_loss_in_pipeline_split=None)
    assert [e for e in check_megatron_args(both, 256) if "cannot be combined with --account-for-loss" in e]


def test_swiglu_clamp_needs_experts():
    flags = _edit(_base(), num_experts=False, activation_func_clamp_value="7")
    flags = [(f, v) for f, v in flags if not f.startswith("--moe") and "expert" not in f]
    errors = check_megatron_args(flags, 256)
    assert [e for e in errors if "--activation-func-clamp-value with --swiglu is for MoE models only" in e], errors


def test_moe_with_tensor_parallelism_needs_sequence_parallelism_to_train():
    plan = case_plan("qwen3-30b-a3b-tp2-sp-ep8")
    flags = [(f, v) for f, v in megatron_flags(plan) if f != "--sequence-parallel"]
    assert [e for e in check_pretrain_needs(flags)
            if "a MoE model with --tensor-model-parallel-size 2 needs --sequence-parallel" in e]
    assert check_pretrain_needs(list(megatron_flags(plan))) == []


# --------------------------------------------------------------------------- what the megatron runtime cannot build


@pytest.mark.parametrize("model, needle", [
    (MIXTRAL | {"moe": MIXTRAL["moe"] | {"router": "sigmoid", "norm_top_k": False}},
     "model.moe.norm_top_k false with router sigmoid"),
    (MIXTRAL | {"moe": MIXTRAL["moe"] | {"top_k": 1}}, "model.moe.norm_top_k true with top_k 1"),
    (MIXTRAL | {"moe": MIXTRAL["moe"] | {"expert_bias": True}}, "model.moe.expert_bias (auxiliary-loss-free"),
    (MIXTRAL | {"bias": True, "moe": MIXTRAL["moe"] | {"shared_experts": 1}},
     "model.bias with model.moe.shared_experts"),
    (DEEPSEEK_V3 | {"qk_norm": True}, "model.qk_norm with model.mla"),
    (MIXTRAL | {"glu_linear_offset": 1.0}, "model.glu_linear_offset with activation swiglu"),
    ({k: v for k, v in MIXTRAL.items() if k != "moe"} | {"activation_clamp": 7.0},
     "model.activation_clamp with swiglu: Megatron-LM clamps SwiGLU only in mixture-of-experts models"),
    (MIXTRAL | {"activation": "gelu", "activation_clamp": 7.0}, "model.activation gelu has no gate"),
])
def test_check_model_refuses_what_megatron_cannot_build(model, needle):
    m = ModelSpec.model_validate(model)
    problems = check_model(m, "megatron")
    assert [p for p in problems if needle in p], problems
    assert check_model(m, "deepspeed") == []


def test_megatron_moe_with_tensor_parallelism_needs_sequence_parallelism_whatever_ep():
    """MoELayer.forward refuses tp > 1 without sequence parallelism even at ep 1: the layout rule says so
    before anything is rendered, and the rendered flags would say it too (check_pretrain_needs)."""
    spec = case_spec(QWEN3_30B_A3B)
    profile = load_profile("dgx16").profile
    layout = Layout(tp=2, pp=1, dp=64, vpp=1, zero_stage=1, micro_batch_size=1, grad_accum_steps=8,
                    recompute="none", sequence_parallel=False, ep=1, etp=1)
    problems = check_layout(layout, spec.model, spec.training, profile, "megatron")
    assert [p for p in problems if "a mixture-of-experts model with tp=2 needs sequence parallelism" in p], problems
    assert not [p for p in check_layout(layout, spec.model, spec.training, profile, "deepspeed")
                if "sequence parallelism" in p]
