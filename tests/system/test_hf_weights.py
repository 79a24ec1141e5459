"""Hugging Face weights in and out of the bundled entrypoint, against transformers itself.

For each family (Llama, Mistral, Qwen2) a tiny random model is made by ``transformers`` from a config
and saved locally (no download); `dsorch import-hf` makes its spec, `dsorch plan --cluster local`
plans it at tp 2 x pp 2 (4 CPU ranks, fp32) with ``training.init_from`` naming the directory, and the
entrypoint's logits on a fixed batch right after loading equal transformers' forward of the same
weights. That proves the layer is the published one (RoPE convention, GQA, RMSNorm epsilon, q/k/v
biases, tied embeddings) and that every tp slice and pipeline stage got its own part.

Llama and Qwen2 then train 3 steps and `dsorch export-hf` writes the last checkpoint; transformers
loads it and its logits equal the entrypoint's at the end of the run. A ZeRO-3 run (pp 1, dp 2)
exports through DeepSpeed's zero_to_fp32.

Tolerance 1e-4 absolute on logits of size ~1: fp32 throughout; what differs is the order of sums
(row-parallel GEMMs add half-length dot products, SDPA against transformers' eager attention),
a few ulp each. Any real mismatch (a rotated half, a swapped k/v slice, the wrong epsilon on
weights near 1) moves logits by 1e-2 or more. Cost on 2 cores: about 40 s per launch.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.system.harness import clean_env
from tests.system.test_train import ROOT

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ATOL = 1e-4
# Each family's own settings on the same shapes: the epsilon, theta and tying differ on purpose.
FAMILIES = {
    "llama": dict(model_type="llama", rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False),
    "mistral": dict(model_type="mistral", rms_norm_eps=1e-6, rope_theta=10000.0, sliding_window=None,
                    tie_word_embeddings=False),
    "qwen2": dict(model_type="qwen2", rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True),
}


def make_hf_model(directory, family: str):
    """A random 4-layer model of ``family`` saved as safetensors; the norms and biases drawn too, so
    that a wrong epsilon, a missing bias or a misplaced norm shows."""
    extra = dict(FAMILIES[family])
    cfg = transformers.AutoConfig.for_model(
        extra.pop("model_type"), hidden_size=64, intermediate_size=176, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=4, vocab_size=256, max_position_embeddings=128,
        dtype="float32", **extra)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in name else 0.05 * torch.randn_like(p))
    model.save_pretrained(directory, safe_serialization=True)
    return model


def spec_and_plan(tmp_path, hf_dir, *pins: str):
    """`dsorch import-hf` of the model's config.json, trained in fp32 from its weights, planned."""
    from click.testing import CliRunner

    from orchestrator.cli.main import main

    spec = tmp_path / "spec.yaml"
    r = CliRunner().invoke(main, ["import-hf", str(hf_dir / "config.json"), "--out", str(spec), "--seq-length",
                                  "64", "--global-batch-size", "8"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load(spec.read_text())
    doc["training"].update(precision="fp32", flash_attention=False, steps=10, init_from=str(hf_dir),
                           optimizer={"lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 1, "weight_decay": 0.0})
    spec.write_text(yaml.safe_dump(doc))
    out = tmp_path / "plan"
    r = CliRunner().invoke(main, ["plan", str(spec), "--cluster", "local", "--out", str(out), *pins],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return out


def launch(plan_dir, nproc: int, run_dir, steps: int, *args: str):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "-m", "orchestrator.train", "--plan", str(plan_dir), "--run-dir", str(run_dir), "--steps", str(steps),
           "--dump-logits", str(run_dir / "logits"), *args]
    p = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    return p


def hf_logits(model, dumped):
    with torch.no_grad():
        return model(dumped["ids"]).logits


def export(run_dir, out):
    from click.testing import CliRunner

    from orchestrator.cli.main import main

    r = CliRunner().invoke(main, ["export-hf", str(run_dir), "--out", str(out)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_init_from_gives_transformers_logits_at_tp2_pp2_and_exports_back(tmp_path, family):
    hf_dir = tmp_path / "hf"
    model = make_hf_model(hf_dir, family)
    plan_dir = spec_and_plan(tmp_path, hf_dir, "--tp", "2", "--pp", "2", "--dp", "1")
    trains = family != "mistral"  # one export per config.json family dsorch writes (llama, qwen2)
    run = tmp_path / "run"
    launch(plan_dir, 4, run, 3 if trains else 0, *(() if trains else ("--no-save",)))

    start = torch.load(run / "logits" / "logits-step0.pt")
    ref = hf_logits(model, start)
    assert ref.abs().max() > 0.1  # the comparison below is not one of zeros
    torch.testing.assert_close(start["logits"], ref, atol=ATOL, rtol=0)
    if not trains:
        return
    end = torch.load(run / "logits" / "logits-step3.pt")
    assert (end["logits"] - start["logits"]).abs().max() > 10 * ATOL  # training moved the weights
    exported = export(run, tmp_path / "out")
    torch.testing.assert_close(end["logits"], hf_logits(exported, end), atol=ATOL, rtol=0)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["model_type"] == ("qwen2" if family == "qwen2" else "llama")
    # Deterministic bytes: a second export of the same checkpoint is the same files.
    export(run, tmp_path / "again")
    for f in sorted((tmp_path / "out").iterdir()):
        assert f.read_bytes() == (tmp_path / "again" / f.name).read_bytes(), f.name


def test_zero3_run_exports_through_zero_to_fp32(tmp_path):
    hf_dir = tmp_path / "hf"
    make_hf_model(hf_dir, "llama")
    plan_dir = spec_and_plan(tmp_path, hf_dir, "--tp", "1", "--pp", "1", "--dp", "2", "--zero", "3",
                             "--gpus-per-node", "2")
    run = tmp_path / "run"
    launch(plan_dir, 2, run, 2)
    end = torch.load(run / "logits" / "logits-step2.pt")
    exported = export(run, tmp_path / "out")
    torch.testing.assert_close(end["logits"], hf_logits(exported, end), atol=ATOL, rtol=0)
