"""`dsorch data prepare` (orchestrator/cli/data.py, orchestrator/train/data/prepare.py): jsonl, text and parquet
to an indexed dataset with a tiny BPE tokenizer trained here (no network), worker-count independence,
atomic output and the errors for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orchestrator.cli.main import main
from orchestrator.train.data.datasets import open_dataset
from orchestrator.train.data.indexed import IndexedDataset

from ..conftest import EXAMPLES, ROOT

tokenizers = pytest.importorskip("tokenizers")

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly vexing boxes".split()


def texts(n: int) -> list[str]:
    """n short documents, different from each other, deterministic."""
    return [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(3 + i % 9)) + f" {i}" for i in range(n)]


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory) -> Path:
    """A byte-level BPE with <|endoftext|> trained on the test documents: a real tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts(200), trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def jsonl(path: Path, docs: list[str], key: str = "text") -> Path:
    path.write_text("".join(json.dumps({key: d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return path


def run(runner, *args):
    return runner.invoke(main, ["data", "prepare", *map(str, args)], catch_exceptions=False)


def test_jsonl_to_indexed_dataset(runner, tmp_path, tok_path):
    from tokenizers import Tokenizer

    docs = texts(30)
    result = run(runner, jsonl(tmp_path / "c.jsonl", docs), "--tokenizer", tok_path, "--out", tmp_path / "out/c")
    assert result.exit_code == 0, result.output
    tok = Tokenizer.from_file(str(tok_path))
    eod = tok.token_to_id("<|endoftext|>")
    ds = IndexedDataset(tmp_path / "out/c")
    assert ds.dtype == np.uint16 and len(ds) == 30
    assert [ds[i].tolist() for i in range(30)] == [tok.encode(d).ids + [eod] for d in docs]
    assert tok.decode(ds[4].tolist()[:-1]) == docs[4]
    assert f"30 documents, {ds.num_tokens:,} tokens (uint16; vocabulary 400, end-of-document id {eod})" in result.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["c.bin", "c.idx"]
    # What prepare writes is what the entrypoint trains on.
    assert open_dataset(str(tmp_path / "out/c"), 512, 8, seed=0).sample(0).shape == (9,)


def test_worker_count_does_not_change_the_files(runner, tmp_path, tok_path):
    """1 and 3 workers give byte-identical files (several batches: more documents than one batch)."""
    src = jsonl(tmp_path / "c.jsonl", texts(700))
    for n in (1, 3):
        result = run(runner, src, "--tokenizer", tok_path, "--out", tmp_path / f"w{n}", "--workers", n)
        assert result.exit_code == 0, result.output
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"w1{suffix}").read_bytes() == (tmp_path / f"w3{suffix}").read_bytes()


def test_plain_text_per_file_and_per_line(runner, tmp_path, tok_path):
    (tmp_path / "a.txt").write_text("first line\nsecond line\n\nthird line\n")
    (tmp_path / "b.txt").write_text("another file")
    whole = run(runner, tmp_path / "a.txt", tmp_path / "b.txt", "--tokenizer", tok_path.parent, "--out", tmp_path / "f")
    lines = run(runner, tmp_path / "a.txt", "--per-line", "--tokenizer", tok_path, "--out", tmp_path / "l")
    assert whole.exit_code == 0 and lines.exit_code == 0, whole.output + lines.output
    assert len(IndexedDataset(tmp_path / "f")) == 2 and len(IndexedDataset(tmp_path / "l")) == 3


def test_parquet_column(runner, tmp_path, tok_path):
    pa = pytest.importorskip("pyarrow", reason="the parquet extra (pyarrow) is not installed")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"content": texts(12), "n": list(range(12))}), tmp_path / "c.parquet")
    result = run(runner, tmp_path / "c.parquet", "--key", "content", "--tokenizer", tok_path, "--out", tmp_path / "p")
    assert result.exit_code == 0, result.output
    assert len(IndexedDataset(tmp_path / "p")) == 12
    missing = run(runner, tmp_path / "c.parquet", "--tokenizer", tok_path, "--out", tmp_path / "q")
    assert missing.exit_code == 2 and "c.parquet: no column 'text' (columns: content, n)" in missing.output


@pytest.mark.parametrize(
    ("line", "message", "workers"),
    [
        ("{not json", r"c\.jsonl:3: not a JSON object", 1),
        ("{not json", r"c\.jsonl:3: not a JSON object", 3),  # read in the parent, raised through the pool
        ('{"body": "x"}', r"c\.jsonl:3: the line has no string under key 'text' \(its keys: body\)", 1),
        ("[1, 2]", r"c\.jsonl:3: the line is not a JSON object", 1),
    ],
)
def test_unreadable_line_names_file_and_line_and_writes_nothing(runner, tmp_path, tok_path, line, message, workers):
    import re

    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"text": "fine too"}) + "\n" + line + "\n")
    result = run(runner, path, "--tokenizer", tok_path, "--out", tmp_path / "out", "--workers", workers)
    assert result.exit_code == 2 and re.search(message, result.output), result.output
    assert "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]


def test_text_that_is_not_utf8(runner, tmp_path, tok_path):
    (tmp_path / "a.txt").write_bytes(b"good\nstill good\nbad \xff byte\n")
    result = run(runner, tmp_path / "a.txt", "--tokenizer", tok_path, "--out", tmp_path / "o")
    assert result.exit_code == 2 and "a.txt:3: not UTF-8" in result.output, result.output
    assert not (tmp_path / "o.bin").exists()


def test_tokenizer_larger_than_the_model(runner, tmp_path, tok_path):
    """examples/tiny.yaml has a vocabulary of 256; the tokenizer has 400."""
    result = run(
        runner, jsonl(tmp_path / "c.jsonl", texts(3)), "--tokenizer", tok_path, "--out", tmp_path / "o", "--spec", EXAMPLES / "tiny.yaml"
    )
    assert result.exit_code == 2, result.output
    assert "the tokenizer's vocabulary has 400 tokens, more than the model's vocab_size 256" in result.output
    assert not (tmp_path / "o.bin").exists()


def test_unknown_eod_token_and_bad_tokenizer(runner, tmp_path, tok_path):
    src = jsonl(tmp_path / "c.jsonl", texts(3))
    named = run(runner, src, "--tokenizer", tok_path, "--out", tmp_path / "o", "--eod-token", "<eos_x>")
    assert named.exit_code == 2 and "the tokenizer has no end-of-document token <eos_x>" in named.output
    (tmp_path / "bad.json").write_text("{}")
    bad = run(runner, src, "--tokenizer", tmp_path / "bad.json", "--out", tmp_path / "o")
    assert bad.exit_code == 2 and "bad.json: not a Hugging Face tokenizer.json" in bad.output


def test_through_the_installed_entry_point(tmp_path, tok_path):
    """The `dsorch` console script next to this interpreter, as a user runs it."""
    dsorch = Path(sys.executable).with_name("dsorch")
    if not dsorch.exists():
        pytest.skip(f"{dsorch} is not installed (pip install -e .)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    src = jsonl(tmp_path / "c.jsonl", texts(5))
    out = subprocess.run(
        [str(dsorch), "data", "prepare", str(src), "--tokenizer", str(tok_path), "--out", str(tmp_path / "d"), "--workers", "2"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "5 documents" in out.stdout and len(IndexedDataset(tmp_path / "d")) == 5


@pytest.mark.parametrize("workers", [1, 2])
def test_interrupted_run_leaves_the_old_files_and_no_temporaries(tmp_path, tok_path, workers):
    """Ctrl-C in the middle (raised from the progress callback of the second batch): the dataset written
    before is untouched and no .tmp file is left."""
    from orchestrator.train.data import prepare as core

    source = core.Source(paths=(jsonl(tmp_path / "c.jsonl", texts(600)),))
    first = core.prepare(source, tok_path, str(tmp_path / "d"))
    before = first.bin_path.read_bytes(), first.idx_path.read_bytes()
    calls = []

    def interrupt(_chars: int) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt

    bigger = core.Source(paths=(source.paths[0], source.paths[0]))
    with pytest.raises(KeyboardInterrupt):
        core.prepare(bigger, tok_path, str(tmp_path / "d"), workers=workers, progress=interrupt)
    assert (first.bin_path.read_bytes(), first.idx_path.read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "d.bin", "d.idx"]
