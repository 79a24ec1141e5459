"""From a jsonl file and a tokenizer.json to a trained, exported Hugging Face model, with dsorch alone.

What issue 26 asks a user to be able to do, run end to end on CPU (4 ranks over gloo, fp32):

1. a tokenizer trained here with ``tokenizers`` (no download) and saved as transformers saves one;
2. ``dsorch data prepare docs.jsonl --tokenizer ... --out data/corpus --spec spec.yaml``: a Megatron-LM
   indexed dataset, the tokenizer's vocabulary checked against the spec's;
3. a random Llama made by ``transformers`` and saved locally; ``dsorch import-hf`` makes the spec, which
   names the data (``training.data``), the tokenizer, ``init_from`` and an evaluation every 2 steps;
4. ``dsorch plan --cluster local --tp 2 --pp 2`` and the bundled entrypoint trains 4 steps from the
   pretrained weights on the prepared data, evaluating on the split's validation part;
5. ``dsorch export-hf`` writes the last checkpoint (and the tokenizer); ``transformers`` loads it and its
   logits equal the run's at its last checkpoint;
6. the same spec plans for ``--runtime megatron`` with the same ``--data-path`` and tokenizer, and, with a
   Megatron-LM checkout in $MEGATRON_LM, Megatron-LM's own argument and dataset-config checks accept it.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml
from click.testing import CliRunner

from orchestrator.cli.main import main
from tests.system.test_hf_weights import ATOL, export, hf_logits, launch, make_hf_model
from tests.system.test_train import ROOT

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

WORDS = "the a model trains on data from every rank and stage of the pipeline with its own slice".split()


def _docs(path, n: int = 300) -> None:
    """Short English-like documents, deterministic."""
    import random

    rnd = random.Random(0)
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            text = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(20, 60)))
            f.write(json.dumps({"id": i, "text": text.capitalize() + "."}) + "\n")


def _tokenizer(directory, docs) -> int:
    """A byte-level BPE of at most 256 tokens with <|endoftext|>, saved as transformers saves one
    (tokenizer.json + tokenizer_config.json); returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=256, special_tokens=["<|endoftext|>"], show_progress=False)
    lines = [json.loads(line)["text"] for line in docs.read_text(encoding="utf-8").splitlines()]
    tok.train_from_iterator(lines, trainer=trainer)
    # tokenizer.json and the tokenizer_config.json transformers writes beside it, written here: a
    # fresh environment's transformers may wrap a tokenizer object in its Python backend.
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}))
    return tok.get_vocab_size()


def _cli(*args: str):
    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r


def test_jsonl_and_tokenizer_to_a_trained_exported_hf_model(tmp_path):
    docs, tok_dir, hf_dir = tmp_path / "docs.jsonl", tmp_path / "tok", tmp_path / "hf"
    _docs(docs)
    assert _tokenizer(tok_dir, docs) <= 256
    model = make_hf_model(hf_dir, "llama")  # vocab 256

    spec = tmp_path / "spec.yaml"
    _cli("import-hf", str(hf_dir / "config.json"), "--out", str(spec), "--seq-length", "64",
         "--global-batch-size", "8")
    prefix = tmp_path / "data" / "corpus"
    doc = yaml.safe_load(spec.read_text())
    doc["training"].update(
        precision="fp32", flash_attention=False, steps=4, init_from=str(hf_dir),
        optimizer={"lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 1, "weight_decay": 0.0},
        data={"path": [str(prefix)], "split": "90,10,0", "eval_interval": 2, "eval_iters": 1,
              "tokenizer": {"type": "HuggingFaceTokenizer", "model": str(tok_dir)}})
    spec.write_text(yaml.safe_dump(doc))

    r = _cli("data", "prepare", str(docs), "--tokenizer", str(tok_dir / "tokenizer.json"), "--out", str(prefix),
             "--spec", str(spec), "--workers", "2")
    assert prefix.with_suffix(".bin").is_file() and prefix.with_suffix(".idx").is_file(), r.output

    plan_dir = tmp_path / "plan"
    _cli("plan", str(spec), "--cluster", "local", "--tp", "2", "--pp", "2", "--dp", "1", "--out", str(plan_dir))
    run = tmp_path / "run"
    p = launch(plan_dir, 4, run, 4)  # no --data: the plan's training.data
    assert str(prefix) in p.stdout and "from the plan's training.data" in p.stdout, p.stdout[-3000:]

    # Trained from the pretrained weights: step 0's logits are transformers' own.
    start = torch.load(run / "logits" / "logits-step0.pt")
    torch.testing.assert_close(start["logits"], hf_logits(model, start), atol=ATOL, rtol=0)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r.get("kind") == "eval"]
    assert [e["step"] for e in evals if not e.get("final")] == [2, 4], evals
    assert all(e["eval_loss"] > 0 and abs(e["eval_ppl"] - torch.tensor(e["eval_loss"]).exp().item()) < 1e-3 * e[
        "eval_ppl"] for e in evals)
    manifest = json.loads(next((run / "checkpoints").glob("*/dsorch_manifest.json")).read_text())
    assert manifest["data"]["datasets"][0]["prefix"].endswith("corpus"), manifest["data"]

    # Exported: transformers loads the model and the tokenizer; the logits are the last checkpoint's.
    out = tmp_path / "exported"
    exported = export(run, out)
    end = torch.load(run / "logits" / "logits-step4.pt")
    assert (end["logits"] - start["logits"]).abs().max() > 10 * ATOL  # training moved the weights
    torch.testing.assert_close(end["logits"], hf_logits(exported, end), atol=ATOL, rtol=0)
    tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.encode("the model trains").ids

    # The same spec for Megatron-LM: the same --data-path and tokenizer.
    mplan = tmp_path / "mplan"
    _cli("plan", str(spec), "--cluster", "local", "--runtime", "megatron", "--out", str(mplan))
    flags = (mplan / "megatron_args.txt").read_text().split()
    assert flags[flags.index("--data-path") + 1] == str(prefix)
    assert flags[flags.index("--tokenizer-model") + 1] == str(tok_dir)
    if os.environ.get("MEGATRON_LM"):
        check = subprocess.run(
            [os.environ.get("MEGATRON_LM_PYTHON", "python"), str(ROOT / "scripts" / "check_megatron_lm.py"),
             "--megatron-lm", os.environ["MEGATRON_LM"], str(mplan)],
            capture_output=True, text=True, timeout=900)
        assert check.returncode == 0 and check.stdout.startswith("PASS"), check.stdout + check.stderr[-3000:]
