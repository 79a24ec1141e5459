"""`dsorch import-hf` (orchestrator/spec/hf_import.py): published config.json files (tests/fixtures/hf,
written from the hub's files, sources in SOURCES.md) become specs whose parameter counts are the
models', that plan; the mixtures of experts come out at their published total and active counts, each
family's pattern of MoE layers, sliding windows and routing mapped exactly, and the shipped MoE
examples are the importer's output; what the spec cannot express is refused with the key."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from orchestrator.cli.main import main
from orchestrator.spec.hf_import import import_config
from orchestrator.spec.model import load_spec

from ..conftest import EXAMPLES

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf"

# Published parameter totals of the checkpoints (tests/fixtures/hf/SOURCES.md). An int is the exact
# total the hub gives; an approx, a total published rounded (Falcon-40B's "about 41.3B", the MoE model
# cards' "46.7B", "116.83B", ...), at the precision published. The extra arguments are what it takes
# to import. MOE_PUBLISHED below has the MoE models' active counts.
PUBLISHED = {
    "Meta-Llama-3-8B": (8_030_261_248, []),
    "Mistral-7B-v0.1": (7_241_732_096, []),  # its 4096-token sliding window carried, see below
    "Mistral-7B-v0.3": (7_248_023_552, []),
    "Qwen2-7B": (7_615_616_512, []),
    "gemma-2b": (2_506_172_416, []),
    "gemma-7b": (8_537_680_896, []),  # head_dim 256 on 16 heads: kv_channels
    "pythia-1b": (1_011_781_632, []),
    "gpt2": (124_439_808, []),
    "falcon-40b": (pytest.approx(41.3e9, rel=1e-3), []),
    "Mixtral-8x7B-v0.1": (pytest.approx(46.7e9, rel=1e-3), []),
    "Qwen1.5-MoE-A2.7B": (pytest.approx(14.3e9, rel=4e-3), []),
    "Qwen3-30B-A3B": (pytest.approx(30.5e9, rel=2e-3), []),
    "Qwen3-235B-A22B": (pytest.approx(235e9, rel=2e-3), []),
    "DeepSeek-V3": (pytest.approx(671e9, rel=1e-3), []),  # the main model; its MTP module apart
    "gpt-oss-120b": (pytest.approx(116.83e9, rel=1e-4), []),
    "gpt-oss-20b": (pytest.approx(20.91e9, rel=1e-3), []),
}
# What the spec cannot express, by the key and the words of the refusal.
REFUSED = {
    "falcon-7b": ("parallel_attn", ["one layernorm shared by attention and MLP"]),
    "Llama-4-Scout-17B-16E": ("text_config.attention_chunk_size", ["8192: chunked attention",
                                                                   "within its block of 8192 tokens"]),
    "AI21-Jamba-1.5-Mini": ("attn_layer_period", ["8: a hybrid of state-space (Mamba)",
                                                  "counted as attention's"]),
}


def run(*args):
    return CliRunner().invoke(main, [*map(str, args)], catch_exceptions=False)


def write_config(tmp: Path, cfg: dict | None = None, /, **keys) -> Path:
    """tmp/config.json holding cfg's keys and the keyword ones."""
    path = tmp / "config.json"
    path.write_text(json.dumps({**(cfg or {}), **keys}))
    return path


LLAMA = dict(model_type="llama", hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=8,
             num_key_value_heads=4, vocab_size=1000, max_position_embeddings=2048, hidden_act="silu")


@pytest.mark.parametrize("extra, key, words", [
    (dict(model_type="mamba"), "model_type", "not a family dsorch imports"),
    (dict(num_local_experts=8), "num_local_experts",
     "8: a mixture-of-experts setting that dsorch's llama import does not map (the expert keys it maps: none"),
    (dict(model_type="mixtral", num_local_experts=8, moe_layer_freq=2), "moe_layer_freq",
     "2: a mixture-of-experts setting that dsorch's mixtral import does not map"),
    (dict(model_type="qwen2", num_nextn_predict_layers=1), "num_nextn_predict_layers", "1: multi-token prediction"),
    (dict(hidden_act="gelu"), "hidden_act", "'gelu'"),
    (dict(attention_bias=True), "attention_bias", "biases on one kind of layer only"),
    (dict(model_type="falcon", parallel_attn=True, new_decoder_architecture=False), "parallel_attn",
     "one layernorm shared"),
    (dict(model_type="falcon", new_decoder_architecture=True, num_ln_in_parallel_attn=1), "num_ln_in_parallel_attn",
     "one layernorm shared"),
    (dict(model_type="falcon", alibi=True), "alibi", "ALiBi"),
])
def test_what_the_spec_cannot_express_is_refused_with_the_key(in_tmp, extra, key, words):
    path = write_config(in_tmp, **{**LLAMA, **extra})
    r = run("import-hf", path, "--out", in_tmp / "spec.yaml")
    assert r.exit_code == 2, r.output
    assert f"{path}: {key}" in r.output and words in r.output and "Traceback" not in r.output
    assert not (in_tmp / "spec.yaml").exists()


def test_an_explicit_head_dim_is_kv_channels(in_tmp):
    """LlamaAttention projects to heads x head_dim (here 8 x 64 = 512 on hidden 256): the spec's
    kv_channels, and the attention counted that wide; head_dim = hidden / heads is left out."""
    r = run("import-hf", write_config(in_tmp, **{**LLAMA, "head_dim": 64}), "--out", in_tmp / "wide.yaml")
    assert r.exit_code == 0, r.output
    wide, _ = load_spec(in_tmp / "wide.yaml")
    assert wide.model.kv_channels == 64 and wide.model.head_dim == 64
    h, q, kv = 256, 8 * 64, 4 * 64
    assert wide.model.attention_params == h * q + 2 * h * kv + q * h
    assert run("import-hf", write_config(in_tmp, **{**LLAMA, "head_dim": 32}), "--out", in_tmp / "same.yaml").exit_code == 0
    assert "kv_channels" not in (in_tmp / "same.yaml").read_text()


def test_a_window_as_long_as_the_context_is_full_attention(in_tmp):
    path = write_config(in_tmp, **{**LLAMA, "model_type": "mistral", "sliding_window": 2048})
    assert run("import-hf", path).exit_code == 0


def test_bad_files_are_refused(in_tmp):
    (in_tmp / "bad.json").write_text("{not json")
    r = run("import-hf", in_tmp / "bad.json")
    assert r.exit_code == 2 and "not a JSON file" in r.output
    (in_tmp / "list.json").write_text("[1, 2]")
    assert "a config.json is a JSON object" in run("import-hf", in_tmp / "list.json").output
    r = run("import-hf", write_config(in_tmp, model_type="llama", hidden_size=256))
    assert r.exit_code == 2 and "no num_attention_heads; a llama config.json states it" in r.output
    out = in_tmp / "spec.yaml"
    out.write_text("keep me")
    r = run("import-hf", write_config(in_tmp, **LLAMA), "--out", out)
    assert r.exit_code == 2 and "exists" in r.output and out.read_text() == "keep me"


def test_the_imported_spec_plans_and_its_notes_are_said(in_tmp):
    path = write_config(in_tmp, **{**LLAMA, "rope_scaling": {"rope_type": "llama3", "factor": 8.0},
                                   "_name_or_path": "org/tiny-llama"})
    r = run("import-hf", path, "--out", in_tmp / "spec.yaml", "--seq-length", "512")
    assert r.exit_code == 0, r.output
    assert "note: not carried: rope_scaling llama3" in r.output
    doc = yaml.safe_load((in_tmp / "spec.yaml").read_text())
    assert doc["name"] == "tiny-llama" and doc["training"] == {"seq_length": 512, "global_batch_size": 8192,
                                                              "precision": "bf16"}
    assert "rope_scaling llama3" in doc["source"]
    assert run("plan", in_tmp / "spec.yaml", "--cluster", "dgx16", "--no-write").exit_code == 0


def test_every_fixture_is_a_case_and_names_its_source():
    folders = {p.parent.name for p in FIXTURES.glob("*/config.json")}
    assert folders == set(PUBLISHED) | set(REFUSED)
    sources = (FIXTURES / "SOURCES.md").read_text()
    assert all(f"`{f}/`" in sources for f in folders)


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_a_published_config_imports_at_its_published_size_plans_and_imports_the_same_twice(in_tmp, model):
    published, args = PUBLISHED[model]
    config = FIXTURES / model / "config.json"
    first, second = in_tmp / "first.yaml", in_tmp / "second.yaml"
    for out in (first, second):
        r = run("import-hf", config, "--out", out, *args)
        assert r.exit_code == 0, r.output
    assert first.read_bytes() == second.read_bytes()
    text = first.read_text()
    assert str(FIXTURES) not in text and str(in_tmp) not in text  # no paths of this machine inside
    spec, _ = load_spec(first)
    assert spec.name == model
    assert spec.model.num_params == published
    r = run("plan", first, "--cluster", "dgx16", "--no-write")
    if r.exit_code == 2 and "does not fit" in r.output:
        # Too big for dgx16's 16 nodes (DeepSeek-V3): the node count the error suggests (test_cli checks it).
        nodes = re.search(r"rerun with --nodes (\d+)", r.output)
        assert nodes, r.output
        r = run("plan", first, "--cluster", "dgx16", "--no-write", "--nodes", nodes.group(1))
    assert r.exit_code == 0, r.output
    assert re.match(rf"{re.escape(model)}: [\d.]+[BM] parameters( \(.* active per token.*\))?, seq ", r.output)
    if spec.model.moe is not None:
        assert f"{spec.model.active_params / 1e9:.2f}B active per token" in r.output


@pytest.mark.parametrize("model", sorted(REFUSED))
def test_a_published_config_the_spec_cannot_express_is_refused_with_the_key(in_tmp, model):
    key, words = REFUSED[model]
    config = FIXTURES / model / "config.json"
    r = run("import-hf", config, "--out", in_tmp / "spec.yaml")
    assert r.exit_code == 2, r.output
    assert r.output.startswith(f"Error: {config}: {key}: ") and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1  # one paragraph
    for w in words:
        assert w in r.output
    assert not (in_tmp / "spec.yaml").exists()


def test_a_sliding_window_no_shorter_than_the_sequence_is_full_attention(in_tmp):
    """Mistral-7B-v0.1 attends over 4096 tokens: with sequences of 4096 or fewer, that is every
    earlier token, so the spec's causal attention is exact; one token more and the spec carries the
    window, which the planner counts (fewer keys per query than full attention)."""
    config = FIXTURES / "Mistral-7B-v0.1" / "config.json"
    r = run("import-hf", config, "--seq-length", "4096", "--out", in_tmp / "spec.yaml")
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load((in_tmp / "spec.yaml").read_text())
    assert doc["training"]["seq_length"] == 4096 and "sliding_window" not in doc["model"]
    r = run("import-hf", config, "--seq-length", "8192", "--out", in_tmp / "longer.yaml")
    assert r.exit_code == 0, r.output
    longer, _ = load_spec(in_tmp / "longer.yaml")
    assert longer.model.sliding_window == 4096 and longer.model.global_attention_every is None
    from orchestrator.costmodel.flops import model_flops_per_step

    full = longer.model.model_copy(update={"sliding_window": None})
    assert model_flops_per_step(longer.model, 8192, 1) < model_flops_per_step(full, 8192, 1)


def test_train_tokens_gives_the_megatron_runtime_its_length(in_tmp):
    """Without a length the megatron runtime refuses the imported spec and says how to give one."""
    config = FIXTURES / "Qwen3-30B-A3B" / "config.json"
    assert run("import-hf", config, "--seq-length", "4096", "--out", in_tmp / "bare.yaml").exit_code == 0
    r = run("plan", in_tmp / "bare.yaml", "--cluster", "gb200-nvl72", "--runtime", "megatron", "--no-write")
    assert r.exit_code == 2 and "dsorch import-hf --train-tokens writes it" in r.output
    r = run("import-hf", config, "--seq-length", "4096", "--train-tokens", "1e12", "--out", in_tmp / "long.yaml")
    assert r.exit_code == 0, r.output
    assert load_spec(in_tmp / "long.yaml")[0].training.train_tokens == 1e12
    r = run("plan", in_tmp / "long.yaml", "--cluster", "gb200-nvl72", "--runtime", "megatron", "--no-write")
    assert r.exit_code == 0, r.output


def test_weight_families_are_import_families():
    """training.init_from loads the families whose layers are dsorch's, named as import-hf names
    them (imp.family): each name must be one of spec/hf_import.py's families, or no model loads."""
    pytest.importorskip("torch")
    from orchestrator.spec.hf_import import HF_FAMILIES
    from orchestrator.train.model.hf_weights import WEIGHT_FAMILIES

    assert set(WEIGHT_FAMILIES) <= {f.name for f in HF_FAMILIES.values()}


def save_model(directory: Path, family: str, **extra) -> None:
    """A small transformers model of the family saved in directory, its config.json beside it
    (test_hf_weights.py's, which needs torch and transformers)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from .test_hf_weights import save_model as save

    save(directory, family, **extra)


def test_import_hf_carries_the_norm_epsilon(tmp_path):
    save_model(tmp_path, "llama", rms_norm_eps=1e-5)
    assert import_config(tmp_path / "config.json").model["norm_epsilon"] == 1e-5
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["rms_norm_eps"]  # LlamaConfig's default when a config leaves it out
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert import_config(tmp_path / "config.json").model["norm_epsilon"] == 1e-6


# Mixtures of experts.


def imported(tmp: Path, config: Path, *args: str):
    out = tmp / "spec.yaml"
    r = run("import-hf", config, "--out", out, "--force", *args)
    assert r.exit_code == 0, r.output
    spec, _ = load_spec(out)
    return spec, r.output


# Published totals and active parameters of the MoE models (model cards; SOURCES.md). "active"
# counts the input embedding, as DeepSeek, Mistral AI and Qwen count it; "active_no_embedding" leaves
# it out, as OpenAI's gpt-oss model card does.
MOE_PUBLISHED = {
    "DeepSeek-V3": dict(total=671e9, active=37e9),
    "Mixtral-8x7B-v0.1": dict(total=46.7e9, active=12.9e9),
    "Qwen3-30B-A3B": dict(total=30.5e9, active=3.3e9),
    "Qwen3-235B-A22B": dict(total=235e9, active=22e9),
    "Qwen1.5-MoE-A2.7B": dict(total=14.3e9, active=2.7e9),
    "gpt-oss-120b": dict(total=116.8e9, active_no_embedding=5.13e9),
    "gpt-oss-20b": dict(total=20.91e9, active_no_embedding=3.61e9),
}


@pytest.mark.parametrize("model", sorted(MOE_PUBLISHED))
def test_total_and_active_parameters_match_the_published_counts(tmp_path, model):
    spec, output = imported(tmp_path, FIXTURES / model / "config.json", "--seq-length", "4096")
    m, published = spec.model, MOE_PUBLISHED[model]
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
def test_what_the_spec_cannot_express_of_moe_and_hybrid_models_is_refused_with_the_key(in_tmp, cfg, key, words):
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
