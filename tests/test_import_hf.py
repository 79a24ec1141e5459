"""`dsorch import-hf`: published config.json files (tests/fixtures/hf, written from the hub's
files, sources in SOURCES.md) become specs whose parameter counts are the models', that plan; what
the spec cannot express is refused with the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from orchestrator.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "hf"


def run(*args):
    return CliRunner().invoke(main, [*map(str, args)], catch_exceptions=False)


def write_config(tmp: Path, **cfg) -> Path:
    path = tmp / "config.json"
    path.write_text(json.dumps(cfg))
    return path


LLAMA = dict(model_type="llama", hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=8,
             num_key_value_heads=4, vocab_size=1000, max_position_embeddings=2048, hidden_act="silu")


@pytest.mark.parametrize("extra, key, words", [
    (dict(model_type="mixtral", num_local_experts=8), "model_type", "not a family dsorch imports"),
    (dict(num_local_experts=8), "num_local_experts", "a mixture of experts"),
    (dict(model_type="mistral", sliding_window=1024), "sliding_window", "sliding window"),
    (dict(head_dim=64), "head_dim", "not hidden_size 256"),
    (dict(hidden_act="gelu"), "hidden_act", "'gelu'"),
    (dict(attention_bias=True), "attention_bias", "biases on one kind of layer only"),
    (dict(model_type="falcon", parallel_attn=True, new_decoder_architecture=False), "parallel_attn",
     "one layernorm shared"),
    (dict(model_type="falcon", new_decoder_architecture=True, num_ln_in_parallel_attn=1), "num_ln_in_parallel_attn",
     "one layernorm shared"),
    (dict(model_type="falcon", alibi=True), "alibi", "ALiBi"),
    (dict(model_type="qwen2", use_sliding_window=True, sliding_window=512), "sliding_window", "sliding window"),
])
def test_what_the_spec_cannot_express_is_refused_with_the_key(in_tmp, extra, key, words):
    path = write_config(in_tmp, **{**LLAMA, **extra})
    r = run("import-hf", path, "--out", in_tmp / "spec.yaml")
    assert r.exit_code == 2, r.output
    assert f"{path}: {key}" in r.output and words in r.output and "Traceback" not in r.output
    assert not (in_tmp / "spec.yaml").exists()


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
