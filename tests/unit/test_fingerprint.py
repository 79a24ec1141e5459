"""What a run trains on (orchestrator/train/data/fingerprint.py): the data's fingerprint in every
checkpoint manifest, what differs between two, the refusal of a resume on other data unless
switched, and the data a run takes (the plan's training.data or `--data`). No processes here; the
entrypoint's refusal runs for real in tests/system/test_run_data.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from orchestrator.spec.training import DataSpec
from orchestrator.train.data import fingerprint as fpm
from orchestrator.train.data.token_file import tokenize_bytes, write_token_file


def _token_file(prefix: Path, text: str) -> Path:
    write_token_file(prefix, tokenize_bytes([text]), ["t.txt"])
    return prefix


def _fp(datasets, base: Path, **kw) -> dict:
    spec = DataSpec(**kw)
    return fpm.fingerprint(datasets, split=spec.split, tokenizer=spec.tokenizer, base=base, vocab_size=256, seed=7)


def test_synthetic_data_has_a_fingerprint(tmp_path):
    assert _fp([], tmp_path) == {"kind": "synthetic", "vocab_size": 256, "seed": 7}
    other = fpm.fingerprint([], split="969,30,1", tokenizer=DataSpec().tokenizer, base=tmp_path, vocab_size=256, seed=8)
    assert fpm.differences(_fp([], tmp_path), other) == ["seed 7 -> 8"]


def test_a_moved_copy_is_the_same_data_and_other_text_is_not(tmp_path):
    a = _token_file(tmp_path / "a" / "corpus", "hello world. " * 50)
    fp = _fp([(None, str(a))], tmp_path)
    rec = fp["datasets"][0]
    assert rec["index"] == "json" and rec["bin_bytes"] == (a.parent / "corpus.bin").stat().st_size
    shutil.copytree(a.parent, tmp_path / "moved")
    assert fpm.differences(fp, _fp([(None, str(tmp_path / "moved" / "corpus.bin"))], tmp_path)) == []
    b = _token_file(tmp_path / "b" / "corpus", "HELLO WORLD. " * 50)  # same size, other tokens
    changed = fpm.differences(fp, _fp([(None, str(b))], tmp_path))
    assert changed == [f"dataset 1 ({a} -> {b}): first/last MiB of .bin, index differ"]


def test_a_large_bin_is_hashed_at_its_ends_and_an_idx_whole(tmp_path, monkeypatch):
    """Past 2 MiB only the first and last MiB count (fingerprint.py says why): a byte changed at
    the end is seen, and so is any change of the .idx."""
    prefix = tmp_path / "big"
    tokens = np.arange(3 << 20, dtype=np.uint8)
    (tmp_path / "big.bin").write_bytes(tokens.tobytes())
    (tmp_path / "big.idx").write_bytes(b"MMIDIDX\x00\x00" + b"\x01" * 40)
    fp = _fp([(None, str(prefix))], tmp_path)
    assert fp["datasets"][0]["index"] == "idx"
    tokens[-1] ^= 1
    (tmp_path / "big.bin").write_bytes(tokens.tobytes())
    assert "first/last MiB of .bin" in fpm.differences(fp, _fp([(None, str(prefix))], tmp_path))[0]
    (tmp_path / "big.idx").write_bytes(b"MMIDIDX\x00\x00" + b"\x02" * 40)
    assert "index" in fpm.differences(fp, _fp([(None, str(prefix))], tmp_path))[0]


def test_weights_split_and_tokenizer_are_part_of_the_data(tmp_path):
    a = _token_file(tmp_path / "a", "abc " * 40)
    b = _token_file(tmp_path / "b", "xyz " * 40)
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text('{"model": 1}')
    base = dict(tokenizer={"type": "HuggingFaceTokenizer", "model": "tok"})
    fp = _fp([(30.0, str(a)), (70.0, str(b))], tmp_path, **base)
    assert fp["tokenizer"]["sha256"] is not None
    assert fpm.differences(fp, _fp([(50.0, str(a)), (50.0, str(b))], tmp_path, **base)) == [
        f"dataset 1 ({a} -> {a}): weight differ",
        f"dataset 2 ({b} -> {b}): weight differ",
    ]
    assert fpm.differences(fp, _fp([(30.0, str(a)), (70.0, str(b))], tmp_path, split="90,10,0", **base)) == [
        "split 969,30,1 -> 90,10,0"
    ]
    (tok / "tokenizer.json").write_text('{"model": 2}')
    changed = fpm.differences(fp, _fp([(30.0, str(a)), (70.0, str(b))], tmp_path, **base))
    assert len(changed) == 1 and changed[0].startswith("tokenizer HuggingFaceTokenizer tok (sha256 ")
    assert fpm.differences(fp, _fp([(30.0, str(a))], tmp_path, **base))[0] == "2 dataset(s) -> 1"


def test_a_resume_on_other_data_is_refused_in_one_paragraph_unless_switched(tmp_path):
    corpus = _token_file(tmp_path / "corpus", "some text " * 30)
    trained = _fp([(None, str(corpus))], tmp_path)
    manifest = {"step": 4, "data": trained}
    tag = tmp_path / "checkpoints" / "step00000004"
    synthetic = _fp([], tmp_path)

    error, switched, note = fpm.resume_check(tag, manifest, synthetic, switch=False)
    assert switched is None and note == "" and "\n" not in error
    assert error.startswith(
        f"{tag} was trained on {corpus}; split 969,30,1; tokenizer NullTokenizer; this start "
        "would train on synthetic tokens (vocab 256, seed 7)"
    )
    assert "(dataset files -> synthetic tokens)" in error
    assert "pass --switch-data to continue on this data on purpose" in error

    error, switched, note = fpm.resume_check(tag, manifest, synthetic, switch=True)
    assert error is None and switched["at_step"] == 4 and switched["from"] == trained
    assert note.startswith("switching data on purpose (--switch-data) at step 4:")

    assert fpm.resume_check(tag, manifest, trained, switch=False) == (None, None, "")
    error, switched, note = fpm.resume_check(tag, {"step": 4}, synthetic, switch=False)
    assert error is None and switched is None and "records no data fingerprint" in note


def test_the_plan_s_data_unless_data_overrides_it(tmp_path):
    spec = DataSpec(path=("30", "rel/a", "70.0", "/abs/b"), split="90,10,0")
    source, blend, origin = fpm.run_data(None, spec, tmp_path)
    assert blend == [(30.0, str(tmp_path / "rel/a")), (70.0, "/abs/b")] and origin == "the plan's training.data"
    assert source.path == ("30", str(tmp_path / "rel/a"), "70.0", "/abs/b") and source.split == "90,10,0"
    source, blend, _ = fpm.run_data(None, DataSpec(path=("a", "/abs/b")), tmp_path)
    assert source.path == (str(tmp_path / "a"), "/abs/b") and blend == [(None, str(tmp_path / "a")), (None, "/abs/b")]
    assert fpm.run_data("/x/tokens", spec, tmp_path) == ("/x/tokens", [(None, "/x/tokens")], "--data")
    source, blend, origin = fpm.run_data(None, DataSpec(), tmp_path)
    assert (source, blend) == (None, []) and origin.startswith("synthetic")
