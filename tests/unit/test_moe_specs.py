"""Mixture-of-experts models through `dsorch import-hf`: the published config.json files
(tests/fixtures/hf, sources in SOURCES.md) come out at their published total and active parameter
counts; each family's pattern of MoE layers, sliding windows and routing is mapped exactly or refused
with the key; the shipped MoE examples are the importer's output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.cli.main import main
from orchestrator.spec.model import load_spec

from ..conftest import EXAMPLES

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf"


def run(*args):
    return CliRunner().invoke(main, [*map(str, args)], catch_exceptions=False)


def imported(tmp: Path, config: Path, *args: str):
    out = tmp / "spec.yaml"
    r = run("import-hf", config, "--out", out, "--force", *args)
    assert r.exit_code == 0, r.output
    spec, _ = load_spec(out)
    return spec, r.output


# Published totals and active parameters (model cards; SOURCES.md). "active" counts the input
# embedding, as DeepSeek, Mistral AI and Qwen count it; "active_no_embedding" leaves it out, as
# OpenAI's gpt-oss model card does.
PUBLISHED = {
    "DeepSeek-V3": dict(total=671e9, active=37e9),
    "Mixtral-8x7B-v0.1": dict(total=46.7e9, active=12.9e9),
    "Qwen3-30B-A3B": dict(total=30.5e9, active=3.3e9),
    "Qwen3-235B-A22B": dict(total=235e9, active=22e9),
    "Qwen1.5-MoE-A2.7B": dict(total=14.3e9, active=2.7e9),
    "gpt-oss-120b": dict(total=116.8e9, active_no_embedding=5.13e9),
    "gpt-oss-20b": dict(total=20.91e9, active_no_embedding=3.61e9),
}


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_total_and_active_parameters_match_the_published_counts(tmp_path, model):
    spec, output = imported(tmp_path, FIXTURES / model / "config.json", "--seq-length", "4096")
    m, published = spec.model, PUBLISHED[model]
    assert m.moe is not None and m.num_moe_layers > 0
    assert m.num_params == pytest.approx(published["total"], rel=0.03)
    if "active" in published:
        assert m.active_params == pytest.approx(published["active"], rel=0.03)
    else:
        assert m.active_params - m.embedding_params == pytest.approx(published["active_no_embedding"], rel=0.03)
    assert m.active_params < m.num_params / 3
    # The command says both, in the units model cards use.
    assert f"{m.num_params / 1e9:.2f}B total, {m.active_params / 1e9:.2f}B active per token" in output
    assert f"{(m.active_params - m.embedding_params) / 1e9:.2f}B without the input embedding" in output


def test_deepseek_v3_mtp_module_matches_the_published_count(tmp_path):
    """DeepSeek's README_WEIGHTS.md: the MTP module holds 11.5B unique parameters beside the shared
    0.9B embedding and 0.9B head; the hub's 685B is 671B plus the module with its own copies of both."""
    spec, output = imported(tmp_path, FIXTURES / "DeepSeek-V3" / "config.json", "--seq-length", "4096")
    m = spec.model
    assert m.mtp_layers == 1
    assert m.mtp_params == pytest.approx(11.5e9, rel=0.03)
    assert m.embedding_params == pytest.approx(0.93e9, rel=0.03)
    assert m.num_params + m.mtp_params + m.embedding_params + m.output_params == pytest.approx(685e9, rel=0.03)
    assert f"multi-token prediction: 1 module, {m.mtp_params / 1e9:.2f}B beside the main model" in output


def test_deepseek_v3_routing_and_attention_are_the_configs(tmp_path):
    config = FIXTURES / "DeepSeek-V3" / "config.json"
    cfg = json.loads(config.read_text())
    m = imported(tmp_path, config, "--seq-length", "4096")[0].model
    assert m.mla is not None and m.moe is not None
    assert (m.mla.q_lora_rank, m.mla.kv_lora_rank, m.mla.qk_nope_head_dim, m.mla.qk_rope_head_dim, m.mla.v_head_dim) == (
        cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"])
    e = m.moe
    assert (e.num_experts, e.top_k, e.ffn_hidden_size, e.shared_experts) == (
        cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"], cfg["n_shared_experts"])
    assert (e.groups, e.group_top_k, e.scale, e.norm_top_k) == (
        cfg["n_group"], cfg["topk_group"], cfg["routed_scaling_factor"], cfg["norm_topk_prob"])
    # scoring_func sigmoid; topk_method noaux_tc: the expert bias, with the sequence-wise loss beside it.
    assert (e.router, e.expert_bias, e.load_balancing) == ("sigmoid", True, "seq_aux_loss")
    assert [m.is_moe_layer(i) for i in range(m.num_layers)] == [
        i >= cfg["first_k_dense_replace"] and i % cfg["moe_layer_freq"] == 0 for i in range(cfg["num_hidden_layers"])]
    assert m.ffn_hidden_size == cfg["intermediate_size"]


def test_gpt_oss_windows_sinks_biases_and_activation_are_the_configs(tmp_path):
    config = FIXTURES / "gpt-oss-120b" / "config.json"
    cfg = json.loads(config.read_text())
    m = imported(tmp_path, config)[0].model
    # layer_types: sliding on even layers, full on odd ones (GptOssConfig's default too).
    assert [m.is_sliding_layer(i) for i in range(m.num_layers)] == [t == "sliding_attention" for t in cfg["layer_types"]]
    assert m.sliding_window == cfg["sliding_window"] and m.global_attention_every == 2
    assert m.attention_sinks and m.bias and m.kv_channels == cfg["head_dim"] and not m.tied_embeddings
    assert (m.activation, m.activation_clamp, m.glu_linear_offset) == ("quick_geglu", cfg["swiglu_limit"], 1.0)
    # GptOssTopKRouter has a bias; GptOssExperts a bias on both projections: the spec's bias flag counts them.
    h, e, f = m.hidden_size, m.moe.num_experts, m.moe.ffn_hidden_size
    assert m.router_params == h * e + e
    assert m.expert_params == 3 * h * f + 2 * f + h


def qwen_moe(**extra) -> dict:
    return dict(model_type="qwen3_moe", hidden_size=256, intermediate_size=512, num_hidden_layers=8,
                num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=1000,
                max_position_embeddings=2048, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
                **extra)


def write_config(tmp: Path, cfg: dict) -> Path:
    path = tmp / "config.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("step", [1, 2, 3, 4])
@pytest.mark.parametrize("dense", [[], [0], [0, 1], [0, 1, 2]])
def test_qwen_sparse_step_and_leading_dense_layers_map_exactly(in_tmp, step, dense):
    """Qwen2MoeDecoderLayer: layer i is sparse when i not in mlp_only_layers and (i + 1) % step == 0;
    the spec's dense_leading_layers and layer_freq give the same layers."""
    spec, _ = imported(in_tmp, write_config(in_tmp, qwen_moe(decoder_sparse_step=step, mlp_only_layers=dense)))
    hf = [i not in dense and (i + 1) % step == 0 for i in range(8)]
    assert [spec.model.is_moe_layer(i) for i in range(8)] == hf


def test_qwen_dense_layers_the_spec_cannot_place_are_refused(in_tmp):
    path = write_config(in_tmp, qwen_moe(mlp_only_layers=[3]))
    r = run("import-hf", path, "--out", in_tmp / "spec.yaml")
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert f"{path}: mlp_only_layers: [3] makes layers 0, 1, 2, 4, 5, 6, 7 mixture-of-experts (7 of 8)" in r.output
    assert not (in_tmp / "spec.yaml").exists()
    # Every layer dense: the dense model.
    spec, _ = imported(in_tmp, write_config(in_tmp, qwen_moe(mlp_only_layers=list(range(8)))))
    assert spec.model.moe is None and spec.model.ffn_hidden_size == 512


def test_qwen2_moe_shared_expert_and_qwen3_head_dim(tmp_path):
    m = imported(tmp_path, FIXTURES / "Qwen1.5-MoE-A2.7B" / "config.json")[0].model
    assert (m.moe.shared_experts, m.moe.shared_ffn_hidden_size, m.moe.shared_expert_gate) == (1, 5632, True)
    assert m.shared_expert_params == 3 * 2048 * 5632 + 2048  # the MLP and its 1 x hidden sigmoid gate
    assert m.qkv_bias and not m.moe.norm_top_k
    q3 = imported(tmp_path, FIXTURES / "Qwen3-30B-A3B" / "config.json")[0].model
    assert q3.qk_norm and q3.kv_channels == 128 and q3.head_dim * q3.num_attention_heads == 4096 != q3.hidden_size


def test_qwen3_dense_heads_are_head_dim_wide_with_qk_norm(in_tmp):
    """Qwen3Config's head_dim defaults to 128 whatever hidden / heads is; Qwen3Attention normalizes each
    head's query and key (q_norm, k_norm over head_dim)."""
    cfg = dict(model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=2,
               num_attention_heads=16, num_key_value_heads=8, vocab_size=1000, max_position_embeddings=2048)
    m = imported(in_tmp, write_config(in_tmp, cfg))[0].model
    assert (m.kv_channels, m.qk_norm, m.moe) == (128, True, None)
    d = 128
    assert m.attention_params == 1024 * 16 * d + 2 * 1024 * 8 * d + 16 * d * 1024 + 2 * d


GPT_OSS = dict(model_type="gpt_oss", num_hidden_layers=4, hidden_size=256, intermediate_size=256, head_dim=32,
               num_attention_heads=8, num_key_value_heads=2, vocab_size=1000, num_local_experts=4)


@pytest.mark.parametrize("cfg, key, words", [
    (dict(model_type="deepseek_v3", scoring_func="softplus"), "scoring_func", "'softplus'"),
    (dict(model_type="deepseek_v3", topk_method="random"), "topk_method", "'random'"),
    (dict(model_type="deepseek_v3", num_key_value_heads=16), "num_key_value_heads", "MLA gives every head"),
    ({**GPT_OSS, "attention_bias": False}, "attention_bias", "GptOssExperts and GptOssTopKRouter carry biases"),
    ({**GPT_OSS, "layer_types": ["sliding_attention", "full_attention", "full_attention", "sliding_attention"]},
     "layer_types", "full attention on layers 1, 2; the spec's full-attention layers are every"),
    (dict(model_type="jamba", layers_block_type=["mamba", "attention"]), "layers_block_type", "hybrid of state-space"),
    (dict(model_type="nemotron_h", hybrid_override_pattern="M-M*-"), "hybrid_override_pattern", "'M-M*-': a hybrid"),
    (dict(model_type="qwen3_next", layer_types=["linear_attention", "full_attention"]), "layer_types",
     "linear-attention layers"),
    (dict(model_type="falcon_h1", mamba_d_ssm=1024), "mamba_d_ssm", "hybrid of state-space"),
    (dict(model_type="llama4_text", attention_chunk_size=8192), "attention_chunk_size", "chunked attention"),
    (dict(model_type="llama4", text_config=dict(no_rope_layers=[1, 1, 1, 0])), "text_config.no_rope_layers",
     "1 of 4 layers without RoPE"),
    (dict(model_type="mixtral", hidden_size=256, shared_expert_intermediate_size=512), "shared_expert_intermediate_size",
     "that dsorch's mixtral import does not map"),
])  # fmt: skip
def test_what_the_spec_cannot_express_is_refused_with_the_key(in_tmp, cfg, key, words):
    path = write_config(in_tmp, cfg)
    r = run("import-hf", path, "--out", in_tmp / "spec.yaml")
    assert r.exit_code == 2, r.output
    assert r.output.startswith(f"Error: {path}: {key}: ") and words in r.output and "Traceback" not in r.output
    assert not (in_tmp / "spec.yaml").exists()


def test_the_summary_goes_to_stderr_when_the_spec_goes_to_stdout(tmp_path):
    r = CliRunner().invoke(main, ["import-hf", str(FIXTURES / "Mixtral-8x7B-v0.1" / "config.json")])
    assert r.exit_code == 0
    assert r.stdout.startswith("# Imported from a Hugging Face config.json") and "active per token" not in r.stdout
    assert "imported: mixtral, 32 layers, hidden 4096" in r.stderr
    assert "experts: 8 routed, top 2, of 14336 each, on 32 of 32 layers" in r.stderr


# The shipped MoE examples: the fixture each model section is imported from.
EXAMPLE_SOURCES = {
    "deepseek-v3": "DeepSeek-V3",
    "mixtral-8x7b": "Mixtral-8x7B-v0.1",
    "qwen3-30b-a3b": "Qwen3-30B-A3B",
    "gpt-oss-120b": "gpt-oss-120b",
}


def model_section(text: str) -> str:
    return text[text.index("\nmodel:\n") + 1 : text.index("\ntraining:\n") + 1]


@pytest.mark.parametrize("name", sorted(EXAMPLE_SOURCES))
def test_a_moe_example_is_the_importers_model_section(tmp_path, name):
    path = EXAMPLES / f"{name}.yaml"
    spec, _ = load_spec(path)
    assert spec.name == name and spec.model.moe is not None
    assert "Megatron-Bridge 25.11 performance table" in spec.source or "Megatron-LM" in spec.source
    t = spec.training
    out = tmp_path / "regenerated.yaml"
    r = run("import-hf", FIXTURES / EXAMPLE_SOURCES[name] / "config.json", "--name", name, "--out", out,
            "--seq-length", t.seq_length, "--global-batch-size", t.global_batch_size)
    assert r.exit_code == 0, r.output
    assert model_section(out.read_text()) == model_section(path.read_text())
