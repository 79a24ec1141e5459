"""The data the entrypoint samples from (orchestrator/train/data/datasets.py): Megatron-LM's --data-path and
--split semantics, blending proportions and determinism, the windows a sample is cut from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.errors import InvalidFile
from orchestrator.spec.training import DataSpec
from orchestrator.train.data.datasets import Blend, BlendedData, blend_from_list, open_dataset, split_bounds

from .test_indexed import write


def corpus(prefix: Path, n_docs: int, first: int, vocab: int = 100, doc_len: int = 10) -> Path:
    """Documents whose tokens say which document they came from: doc i is all (first + i) % vocab."""
    return write(prefix, [[(first + i) % vocab] * doc_len for i in range(n_docs)])


def test_blend_from_list_follows_megatron():
    """megatron/core/datasets/utils.py get_blend_from_list + normalize."""
    assert blend_from_list(["a"]) == (["a"], None)
    assert blend_from_list(["a", "b"]) == (["a", "b"], None)
    assert blend_from_list(["3", "a", "1", "b"]) == (["a", "b"], [0.75, 0.25])
    with pytest.raises(InvalidFile, match="weight prefix pairs with every weight a positive number"):
        blend_from_list(["0.3", "a", "b", "c"])
    with pytest.raises(InvalidFile, match="positive"):
        blend_from_list(["0", "a", "1", "b"])


def test_split_bounds_follow_megatron():
    """parse_and_normalize_split + convert_split_vector_to_split_matrix: '969,30,1' -> running sums."""
    train, valid, test = split_bounds("969,30,1")
    assert train == (0.0, 0.969) and valid[0] == 0.969 and test[1] == pytest.approx(1.0)
    assert split_bounds("1") == [(0.0, 1.0), None, None]
    assert split_bounds("8,2") == [(0.0, 0.8), (0.8, 1.0), None]


def test_split_takes_contiguous_documents(tmp_path):
    """Each part holds only its own documents: round(edge * 20) of 20 documents at each edge."""
    prefix = corpus(tmp_path / "d", n_docs=20, first=0)
    spec = DataSpec(path=(str(prefix),), split="7,2,1")
    seen = {}
    for part in ("train", "valid", "test"):
        ds = open_dataset(spec, 100, 4, seed=3, split=part)
        seen[part] = {int(t) for i in range(50) for t in ds.sample(i)}
    assert seen["train"] == set(range(14)) and seen["valid"] == set(range(14, 18)) and seen["test"] == {18, 19}


def test_part_without_share_is_an_error(tmp_path):
    spec = DataSpec(path=(str(corpus(tmp_path / "d", 20, 0)),), split="1,0,0")
    with pytest.raises(InvalidFile, match="split '1,0,0' gives the valid part no share"):
        open_dataset(spec, 100, 4, 0, split="valid")


def test_part_too_small_is_an_error(tmp_path):
    spec = DataSpec(path=(str(corpus(tmp_path / "d", 20, 0)),), split="969,30,1")
    with pytest.raises(InvalidFile, match=r"d\.bin: its test part \(documents 20\.\.20 of 20.*0 tokens"):
        open_dataset(spec, 100, 4, 0, split="test")


def test_relative_prefixes_are_relative_to_the_current_directory(tmp_path, monkeypatch):
    corpus(tmp_path / "d", 20, 0)
    monkeypatch.chdir(tmp_path)
    assert open_dataset("d", 100, 4, 0).sample(0).shape == (5,)


@pytest.mark.parametrize("weights", [[0.3, 0.7], [0.5, 0.5], [0.2, 0.5, 0.3], [1 / 3, 1 / 3, 1 / 3]])
def test_blend_matches_a_full_merge_and_keeps_the_weights(weights):
    """Blend(i) is the i-th sample of the merge of every dataset's times (k + 0.5) / w (ties to the lower
    dataset), computed here by brute force, across block edges; each share stays near w * n."""
    n = 3 * Blend.BLOCK + 17
    times = sorted(((k + 0.5) / w, d, k) for d, w in enumerate(weights) for k in range(n))[:n]
    blend = Blend(weights)
    got = [blend(i) for i in range(n)]
    assert got == [(d, k) for _, d, k in times]
    counts = np.zeros(len(weights))
    for i, (d, _) in enumerate(got, start=1):
        counts[d] += 1
        assert np.abs(counts - np.array(weights) * i).max() <= 1.0, i
    # A late index alone (a resumed run) gives the same answer as walking there.
    assert Blend(weights)(n - 1) == got[-1]


def test_blended_data_proportions_and_determinism(tmp_path):
    """'0.25 a 0.75 b': a quarter of the samples from a (tokens 0-9), the rest from b (tokens 50-59);
    the same (seed, index) gives the same sample in a fresh reader, another seed another order."""
    a, b = corpus(tmp_path / "a", 10, 0), corpus(tmp_path / "b", 10, 50)
    spec = DataSpec(path=("0.25", str(a), "0.75", str(b)), split="1")
    ds = open_dataset(spec, 100, 4, seed=1)
    samples = [ds.sample(i) for i in range(400)]
    from_a = sum(int(s.max()) < 50 for s in samples)
    assert from_a == 100
    again = open_dataset(spec, 100, 4, seed=1)
    assert all(np.array_equal(again.sample(i), samples[i]) for i in (399, 0, 123))
    other = open_dataset(spec, 100, 4, seed=2)
    assert any(not np.array_equal(other.sample(i), samples[i]) for i in range(20))
    assert isinstance(open_dataset(f"0.25 {a} 0.75 {b}", 100, 4, 1), BlendedData)
    assert np.array_equal(open_dataset(f"0.25 {a} 0.75 {b}", 100, 4, 1).sample(7), samples[7])


def test_unweighted_blend_goes_by_size(tmp_path):
    """Without weights Megatron-LM blends by each dataset's size (BlendedMegatronDatasetBuilder.build)."""
    a, b = corpus(tmp_path / "a", 10, 0), corpus(tmp_path / "b", 30, 50)
    ds = open_dataset([str(a), str(b)], 100, 4, seed=0)
    assert ds.weights == pytest.approx([0.25, 0.75], abs=0.01)


def test_samples_are_windows_of_the_documents_in_file_order(tmp_path):
    """A sample is seq_length + 1 consecutive tokens of the concatenated documents (across their ends)."""
    prefix = write(tmp_path / "d", [list(range(1, 8)), list(range(8, 20))])
    ds = open_dataset(str(prefix), 100, 4, seed=0)
    flat = list(range(1, 20))
    windows = sorted(ds.sample(i).tolist() for i in range(ds.parts[0].num_windows))
    assert windows == [flat[s : s + 5] for s in range(0, len(flat) - 4, 4)]


def test_legacy_token_file_still_reads(tmp_path):
    """NAME.bin + NAME.json (scripts/make_token_file.py) opens as before."""
    import json

    np.arange(1, 41, dtype="<u2").tofile(tmp_path / "t.bin")
    meta = {"format": "dsorch-tokens-v1", "dtype": "uint16", "vocab_size": 256, "num_tokens": 40}
    (tmp_path / "t.json").write_text(json.dumps(meta))
    ds = open_dataset(str(tmp_path / "t"), 256, 4, seed=1)
    assert ds.describe().endswith("(40 tokens, 9 windows)")
    assert open_dataset(DataSpec(), 256, 4, 1).describe().startswith("synthetic")
