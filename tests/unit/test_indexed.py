"""Megatron-LM's indexed dataset (orchestrator/train/data/indexed.py): the byte layout, Megatron-LM's own
reader on dsorch's files, each damaged-file error."""

from __future__ import annotations

import os
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from orchestrator.errors import InvalidFile
from orchestrator.spec.training import DataSpec
from orchestrator.train.data.datasets import open_dataset
from orchestrator.train.data.indexed import IndexedDataset, IndexedWriter, token_dtype

DOCS = [[5, 6, 7, 0], [1, 0], [], [9, 9, 9, 9, 9, 0]]


def write(prefix: Path, docs, dtype=np.uint16) -> Path:
    with IndexedWriter(prefix, dtype) as w:
        for doc in docs:
            w.add_document(doc)
        w.finish()
    return prefix


def test_layout_is_megatrons_byte_for_byte(tmp_path):
    """The .idx bytes, written out by hand from the layout megatron/core/datasets/indexed_dataset.py
    documents (header, int32 lengths, int64 byte pointers, int64 document indices)."""
    write(tmp_path / "d", DOCS, np.int32)
    lengths = [len(d) for d in DOCS]
    pointers = [4 * sum(lengths[:i]) for i in range(len(DOCS))]
    expected = (
        b"MMIDIDX\x00\x00"
        + struct.pack("<QBQQ", 1, 4, len(DOCS), len(DOCS) + 1)
        + struct.pack(f"<{len(DOCS)}i", *lengths)
        + struct.pack(f"<{len(DOCS)}q", *pointers)
        + struct.pack(f"<{len(DOCS) + 1}q", *range(len(DOCS) + 1))
    )
    assert (tmp_path / "d.idx").read_bytes() == expected
    assert (tmp_path / "d.bin").read_bytes() == np.concatenate(DOCS).astype("<i4").tobytes()
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_round_trip(tmp_path, dtype):
    ds = IndexedDataset(write(tmp_path / "d", DOCS, dtype))
    assert ds.dtype == np.dtype(dtype)
    assert [ds[i].tolist() for i in range(len(ds))] == DOCS
    assert ds.num_tokens == sum(map(len, DOCS)) and ds.max_token() == 9
    assert ds.max_token(chunk=3) == 9


def test_dtype_follows_megatron():
    """DType.optimal_dtype: uint16 below 65,500 tokens of vocabulary, else int32."""
    assert token_dtype(65499) is np.uint16 and token_dtype(65500) is np.int32


def test_writer_leaves_nothing_when_interrupted(tmp_path):
    with pytest.raises(RuntimeError), IndexedWriter(tmp_path / "d", np.uint16) as w:
        w.add_document([1, 2])
        raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


def test_megatrons_reader_reads_dsorch_output(tmp_path, monkeypatch):
    """Megatron-LM's own IndexedDataset reads what dsorch writes, token for token. Needs a Megatron-LM
    checkout in $MEGATRON_LM; megatron.core.utils (which imports all of megatron.core) is replaced by a
    stub giving its one logging helper, the reader itself is Megatron's file."""
    checkout = os.environ.get("MEGATRON_LM")
    if not checkout:
        pytest.skip("MEGATRON_LM is not set: point it at a Megatron-LM checkout")
    pkg = tmp_path / "mlm" / "megatron" / "core"
    (pkg / "datasets").mkdir(parents=True)
    for name in ("datasets/indexed_dataset.py", "datasets/object_storage_utils.py", "msc_utils.py"):
        shutil.copy(Path(checkout) / "megatron" / "core" / name, pkg / name)
    for init in (pkg.parent, pkg, pkg / "datasets"):
        (init / "__init__.py").write_text("")
    (pkg / "utils.py").write_text(
        "def log_single_rank(logger, *args, rank=0, **kwargs):\n    logger.log(*args, **kwargs)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "mlm"))
    for name in [m for m in sys.modules if m == "megatron" or m.startswith("megatron.")]:
        monkeypatch.delitem(sys.modules, name)
    from megatron.core.datasets.indexed_dataset import IndexedDataset as MegatronIndexed

    for dtype in (np.uint16, np.int32):
        theirs = MegatronIndexed(str(write(tmp_path / f"d{np.dtype(dtype).name}", DOCS, dtype)))
        assert len(theirs) == len(DOCS)
        assert [theirs[i].tolist() for i in range(len(DOCS))] == DOCS
        assert theirs.document_indices.tolist() == list(range(len(DOCS) + 1))


# -- damaged pairs: each names the file and the fix ---------------------------------------------


def test_missing_half(tmp_path):
    write(tmp_path / "d", DOCS)
    (tmp_path / "d.idx").unlink()
    with pytest.raises(InvalidFile, match=r"d\.idx: missing.*only d\.bin exists.*dsorch data prepare"):
        IndexedDataset(tmp_path / "d")
    with pytest.raises(InvalidFile, match=r"d\.idx: missing"):
        open_dataset(str(tmp_path / "d"), 100, 4, 0)
    with pytest.raises(InvalidFile, match=r"nowhere: no dataset there: neither nowhere\.bin nor nowhere\.idx exists"):
        open_dataset(DataSpec(path=(str(tmp_path / "nowhere"),)), 100, 4, 0)


def test_bad_magic(tmp_path):
    idx = write(tmp_path / "d", DOCS).with_suffix(".idx")
    idx.write_bytes(b"TNTIDX\x00\x00\x00" + idx.read_bytes()[9:])
    with pytest.raises(InvalidFile, match=r"d\.idx: not a Megatron-LM indexed dataset \(magic"):
        IndexedDataset(tmp_path / "d")


@pytest.mark.parametrize("cut", [5, 40])
def test_truncated_index(tmp_path, cut):
    idx = write(tmp_path / "d", DOCS).with_suffix(".idx")
    idx.write_bytes(idx.read_bytes()[:cut])
    with pytest.raises(InvalidFile, match=r"d\.idx: (truncated|\d+ bytes, but its header counts 4 sequences)"):
        IndexedDataset(tmp_path / "d")


@pytest.mark.parametrize("change", [-2, 2])
def test_bin_does_not_match_index(tmp_path, change):
    bin_path = write(tmp_path / "d", DOCS).with_suffix(".bin")
    data = bin_path.read_bytes()
    bin_path.write_bytes(data[:change] if change < 0 else data + b"\0" * change)
    state = "truncated" if change < 0 else "longer than its index says"
    with pytest.raises(
        InvalidFile, match=rf"d\.bin: {len(data) + change} bytes, but d\.idx describes {len(data)} bytes.*{state}"
    ):
        IndexedDataset(tmp_path / "d")


def test_pointers_that_do_not_match_lengths(tmp_path):
    idx = write(tmp_path / "d", DOCS).with_suffix(".idx")
    raw = bytearray(idx.read_bytes())
    struct.pack_into("<q", raw, 34 + 4 * len(DOCS) + 8, 2)  # the second pointer
    idx.write_bytes(bytes(raw))
    with pytest.raises(InvalidFile, match=r"d\.idx: its sequence pointers are not the running sum"):
        IndexedDataset(tmp_path / "d")


def test_token_outside_vocabulary(tmp_path):
    write(tmp_path / "d", [[1, 2, 3, 700] * 10])
    with pytest.raises(InvalidFile, match=r"d\.bin: token id 700 is outside the model's vocabulary of 512"):
        open_dataset(str(tmp_path / "d"), 512, 4, 0)
    assert open_dataset(str(tmp_path / "d"), 701, 4, 0).sample(0).max() <= 700
