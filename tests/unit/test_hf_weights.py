"""Hugging Face weights in and out (train/model/hf_weights.py), in one process at tp 1: the name mapping
both ways, and what a bad weights directory gets (one paragraph naming the key or tensor and both
values). The multi-rank logits against transformers are tests/system/test_hf_weights.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from orchestrator.errors import CheckpointError, InvalidFile  # noqa: E402
from orchestrator.plan.layout import Layout  # noqa: E402
from orchestrator.spec.hf_import import import_config, spec_document  # noqa: E402
from orchestrator.spec.model import SpecFile  # noqa: E402
from orchestrator.train.model import hf_weights  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SHAPES = dict(hidden_size=64, intermediate_size=176, num_attention_heads=4, num_key_value_heads=2,
              num_hidden_layers=2, vocab_size=256, max_position_embeddings=128)


def save_model(directory: Path, family: str = "qwen2", **extra) -> dict[str, torch.Tensor]:
    cfg = transformers.AutoConfig.for_model(family, **SHAPES, **extra)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    model.save_pretrained(directory, safe_serialization=True)
    return {k: v.clone() for k, v in model.state_dict().items()}


def spec_for(directory: Path, **model_changes) -> SpecFile:
    doc = spec_document(import_config(directory / "config.json"), "test", 64, 8)
    doc["model"].update(model_changes)
    doc["training"].update(precision="fp32", init_from=str(directory))
    return SpecFile.model_validate(doc)


def dense_module(spec: SpecFile):
    from orchestrator.train.model.decoder import DenseModel, LossFn, layer_specs
    from orchestrator.train.model.tensor_parallel import TPContext

    lay = Layout(tp=1, pp=1, dp=1, vpp=1, zero_stage=0, micro_batch_size=1, grad_accum_steps=1,
                 recompute="none", sequence_parallel=False)
    tp = TPContext(None, False)
    return DenseModel(layer_specs(spec.model, 64, lay, tp, 1), LossFn(tp), False)


@pytest.mark.parametrize(("family", "extra"), [
    ("llama", {}),
    ("llama", {"attention_bias": True, "mlp_bias": True}),  # the spec's bias: every linear layer
    ("qwen2", {"tie_word_embeddings": True}),
], ids=["llama", "llama-biases", "qwen2-tied"])
def test_weights_go_in_and_come_out_unchanged(tmp_path, family, extra):
    hf = save_model(tmp_path, family, **extra)
    spec = spec_for(tmp_path)
    module = dense_module(spec)
    hf_weights.load_init_from(module, spec, 0, 1)
    back = hf_weights.to_hf(spec.model, {k: v.detach() for k, v in module.state_dict().items()})
    assert sorted(back) == sorted(k for k in hf if not (spec.model.tied_embeddings and k == "lm_head.weight"))
    for k, v in back.items():
        assert torch.equal(v, hf[k]), k


def test_a_config_that_disagrees_with_the_spec_names_the_key_and_both_values(tmp_path):
    save_model(tmp_path)
    spec = spec_for(tmp_path, tied_embeddings=True, norm_epsilon=1e-5)
    with pytest.raises(InvalidFile, match=r"model.tied_embeddings: the spec has True, config.json False.*"
                                          r"model.norm_epsilon: the spec has 1e-05, config.json 1e-06"):
        hf_weights.load_init_from(dense_module(spec), spec, 0, 1)


def test_a_tensor_of_another_shape_is_named_with_both_shapes(tmp_path):
    from safetensors.torch import load_file, save_file

    save_model(tmp_path)
    f = tmp_path / "model.safetensors"
    tensors = load_file(f)
    tensors["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(16, 64)
    save_file(tensors, f)
    spec = spec_for(tmp_path)
    with pytest.raises(InvalidFile, match=r"tensor model.layers.1.self_attn.k_proj.weight has shape \[16, 64\]; "
                                          r"the spec's model needs \[32, 64\]"):
        hf_weights.load_init_from(dense_module(spec), spec, 0, 1)


def test_a_file_that_is_not_safetensors_is_named(tmp_path):
    save_model(tmp_path)
    spec = spec_for(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"PK\x03\x04 a zip file, not safetensors")
    with pytest.raises(InvalidFile, match=r"model.safetensors: not a readable safetensors file"):
        hf_weights.load_init_from(dense_module(spec), spec, 0, 1)


def test_scaled_rope_is_refused_not_loaded_into_plain_rope(tmp_path):
    save_model(tmp_path, "llama", rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    spec = spec_for(tmp_path)
    with pytest.raises(InvalidFile, match=r"rope_scaling llama3"):
        hf_weights.check_config(tmp_path, spec)


def test_zero3_export_at_tp2_is_refused_with_the_reason(tmp_path):
    spec = SpecFile.model_validate(yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text()))
    lay = Layout(tp=2, pp=1, dp=2, vpp=1, zero_stage=3, micro_batch_size=1, grad_accum_steps=1,
                 recompute="none", sequence_parallel=False)
    with pytest.raises(CheckpointError, match="zero_to_fp32 merges the data-parallel partitions of one"):
        hf_weights.full_state(tmp_path, spec.model, lay)


def test_an_existing_export_directory_is_not_overwritten(tmp_path):
    spec = SpecFile.model_validate(yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text()))
    (tmp_path / "out").mkdir()
    with pytest.raises(CheckpointError, match="exists; remove it or export with --out"):
        hf_weights.export_checkpoint(tmp_path, None, spec, tmp_path / "out")


def test_megatron_plans_carry_the_epsilon_and_say_init_from_is_not_theirs(tmp_path):
    from click.testing import CliRunner

    from orchestrator.cli.main import main

    doc = yaml.safe_load((ROOT / "examples" / "llama3-8b.yaml").read_text())
    doc["model"]["norm_epsilon"] = 1e-6
    doc["training"]["init_from"] = "/models/Meta-Llama-3-8B"
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(doc))
    r = CliRunner().invoke(main, ["plan", str(tmp_path / "s.yaml"), "--cluster", "dgx16", "--nodes", "1",
                                  "--runtime", "megatron", "--out", str(tmp_path / "p")], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "--norm-epsilon 1e-06\n" in (tmp_path / "p" / "megatron_args.txt").read_text()
    assert "init_from" not in (tmp_path / "p" / "megatron_args.txt").read_text()
    assert "training.init_from /models/Meta-Llama-3-8B is read by the deepspeed runtime's bundled" in " ".join(
        r.output.split())


def test_export_hf_of_a_run_without_a_checkpoint_is_one_paragraph_exit_2(tmp_path):
    from click.testing import CliRunner

    from orchestrator.cli.main import main

    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    r = CliRunner().invoke(main, ["export-hf", str(tmp_path / "run")])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "no intact checkpoint" in r.output


def test_a_family_whose_layers_are_not_dsorchs_is_refused(tmp_path):
    save_model(tmp_path, "gemma", head_dim=16)
    spec = spec_for(tmp_path)
    with pytest.raises(InvalidFile, match=r"a gemma model; training.init_from loads the llama, mistral, qwen2"):
        hf_weights.check_config(tmp_path, spec)
