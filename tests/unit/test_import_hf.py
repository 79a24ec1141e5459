"""`dsorch import-hf`: published config.json files (tests/fixtures/hf, written from the hub's
files, sources in SOURCES.md) become specs whose parameter counts are the models', that plan; what
the spec cannot express is refused with the key."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from orchestrator.cli.main import main
from orchestrator.spec.model import load_spec

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf"

# Published parameter totals of the checkpoints (tests/fixtures/hf/SOURCES.md). An int is the exact
# total the hub gives; an approx, a total published rounded (Falcon-40B's "about 41.3B", the MoE model
# cards' "46.7B", "116.83B", ...), at the precision published. The extra arguments are what it takes
# to import. test_moe_specs.py checks the MoE models' active counts.
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


def write_config(tmp: Path, **cfg) -> Path:
    path = tmp / "config.json"
    path.write_text(json.dumps(cfg))
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
