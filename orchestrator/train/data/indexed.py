"""Megatron-LM's indexed dataset (``PREFIX.bin`` + ``PREFIX.idx``, the "MMIDIDX" format): one reader
and one writer, so that one preprocessed corpus trains under either runtime.

The layout, as megatron/core/datasets/indexed_dataset.py (_IndexWriter.write, _IndexReader.__init__,
IndexedDatasetBuilder) writes and reads it, all little-endian::

    PREFIX.idx  magic b"MMIDIDX\\x00\\x00" (9 bytes), version <Q = 1, dtype code <B (DType: 1 uint8,
                2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16),
                sequence count <Q (n), document count <Q (d),
                n int32 sequence lengths (tokens), n int64 sequence pointers (byte offsets into .bin),
                d int64 document indices (0, then the sequence index that ends each document),
                optionally n int8 sequence modes (multimodal datasets; read past, not used here)
    PREFIX.bin  the token ids of every sequence, one after another, in the dtype of the code

dsorch writes one sequence per document (as Megatron's tools/preprocess_data.py does without
--split-sentences), so the document indices are 0, 1, ..., n. Both files are memory-mapped.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from orchestrator.errors import InvalidFile

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
# megatron/core/datasets/indexed_dataset.py: DType (the code is the enum's value).
DTYPE_CODES: dict[int, type[np.number]] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
# magic, version, dtype code, sequence count, document count: 34 bytes (_IndexReader's offset).
_HEADER = struct.Struct("<9sQBQQ")
_FIX = "rewrite the pair with `dsorch data prepare` (or Megatron-LM's tools/preprocess_data.py)"


def dataset_paths(prefix: str | os.PathLike) -> tuple[Path, Path]:
    """PREFIX.bin and PREFIX.idx (megatron/core/datasets/indexed_dataset.py get_bin_path/get_idx_path)."""
    prefix = str(prefix)
    return Path(prefix + ".bin"), Path(prefix + ".idx")


def is_indexed(prefix: str | os.PathLike) -> bool:
    """Whether either half of an indexed dataset exists at PREFIX (a missing half is the reader's error)."""
    return any(p.exists() for p in dataset_paths(prefix))


def token_dtype(vocab_size: int) -> type[np.number]:
    """The token dtype Megatron-LM chooses for a vocabulary (DType.optimal_dtype: uint16 below 65,500)."""
    return np.uint16 if vocab_size < 65500 else np.int32


class IndexedDataset:
    """The sequences of one ``PREFIX.bin`` + ``PREFIX.idx`` pair, checked against each other on opening."""

    def __init__(self, prefix: str | os.PathLike):
        self.prefix = str(prefix)
        self.bin_path, self.idx_path = dataset_paths(prefix)
        if not self.bin_path.is_file() and not self.idx_path.is_file():
            raise InvalidFile(
                f"{self.prefix}: no dataset there: neither {self.bin_path.name} nor {self.idx_path.name} exists "
                f"(relative paths are relative to the current directory, {Path.cwd()}); give the prefix of a "
                f"PREFIX.bin + PREFIX.idx pair, as `dsorch data prepare --out PREFIX` writes it"
            )
        for path, other in ((self.idx_path, self.bin_path), (self.bin_path, self.idx_path)):
            if not path.is_file():
                raise InvalidFile(
                    f"{path}: missing; an indexed dataset is the pair {self.prefix}.bin + {self.prefix}.idx and "
                    f"only {other.name} exists; give the prefix without the suffix, or {_FIX}"
                )
        idx = np.memmap(self.idx_path, dtype=np.uint8, mode="r") if self.idx_path.stat().st_size else None
        if idx is None or len(idx) < _HEADER.size:
            raise InvalidFile(
                f"{self.idx_path}: truncated ({0 if idx is None else len(idx)} bytes, shorter than the header); {_FIX}"
            )
        magic, version, code, n, d = _HEADER.unpack(idx[: _HEADER.size].tobytes())
        if magic != MAGIC:
            raise InvalidFile(
                f"{self.idx_path}: not a Megatron-LM indexed dataset (magic {magic!r}, expected {MAGIC!r}); {_FIX}"
            )
        if version != VERSION or code not in DTYPE_CODES:
            raise InvalidFile(
                f"{self.idx_path}: version {version}, dtype code {code}; this reader knows version 1, codes 1-8"
            )
        self.dtype = np.dtype(DTYPE_CODES[code]).newbyteorder("<")
        base = _HEADER.size + 12 * n + 8 * d
        if len(idx) not in (base, base + n):  # + n: the optional int8 sequence modes
            raise InvalidFile(
                f"{self.idx_path}: {len(idx)} bytes, but its header counts {n} sequences and {d} document "
                f"indices ({base} bytes); the file is truncated or damaged, {_FIX}"
            )
        self.sequence_lengths = np.frombuffer(idx, dtype="<i4", count=n, offset=_HEADER.size)
        self.sequence_pointers = np.frombuffer(idx, dtype="<i8", count=n, offset=_HEADER.size + 4 * n)
        self.document_indices = np.frombuffer(idx, dtype="<i8", count=d, offset=_HEADER.size + 12 * n)
        self._check_against_bin()
        size = self.bin_path.stat().st_size
        self.tokens = np.memmap(self.bin_path, dtype=self.dtype, mode="r") if size else np.empty(0, self.dtype)
        # Token offset of each sequence: the pointers are bytes.
        self.starts = self.sequence_pointers // self.dtype.itemsize

    def _check_against_bin(self) -> None:
        """The pointers, lengths and document indices describe exactly the .bin next to them: pointers
        are the running byte sum of the lengths (_IndexWriter._sequence_pointers) ending at its size."""
        lengths, pointers, docs = self.sequence_lengths, self.sequence_pointers, self.document_indices
        item = self.dtype.itemsize
        ends = np.cumsum(lengths.astype(np.int64)) * item
        expected = np.concatenate(([0], ends[:-1])) if len(lengths) else ends
        size = self.bin_path.stat().st_size
        total = int(ends[-1]) if len(ends) else 0
        if (lengths < 0).any() or not np.array_equal(pointers, expected):
            raise InvalidFile(
                f"{self.idx_path}: its sequence pointers are not the running sum of its sequence lengths; "
                f"this reader takes sequences stored one after another, as Megatron-LM writes them; {_FIX}"
            )
        if total != size:
            state = "truncated" if size < total else "longer than its index says"
            raise InvalidFile(
                f"{self.bin_path}: {size} bytes, but {self.idx_path.name} describes {total} bytes "
                f"({len(lengths)} sequences of {self.dtype.name}); the .bin is {state} or the pair does not "
                f"belong together; {_FIX}"
            )
        if len(docs) == 0 or docs[0] != 0 or docs[-1] != len(lengths) or (np.diff(docs) < 0).any():
            raise InvalidFile(
                f"{self.idx_path}: its document indices do not run from 0 to its {len(lengths)} sequences; {_FIX}"
            )

    def __len__(self) -> int:
        return len(self.sequence_lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        start = int(self.starts[i])
        return self.tokens[start : start + int(self.sequence_lengths[i])]

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    def max_token(self, chunk: int = 1 << 24) -> int:
        """The largest token id, read in chunks of `chunk` tokens (the .bin stays memory-mapped)."""
        best = -1
        for start in range(0, len(self.tokens), chunk):
            best = max(best, int(self.tokens[start : start + chunk].max()))
        return best


class IndexedWriter:
    """Writes PREFIX.bin + PREFIX.idx byte for byte as Megatron-LM's IndexedDatasetBuilder
    (add_document per document, then finalize). Atomic: both go to ``*.tmp`` names first and are
    renamed only by ``finish``; leaving the ``with`` block by an exception removes them."""

    def __init__(self, prefix: str | os.PathLike, dtype: type[np.number]):
        self.bin_path, self.idx_path = dataset_paths(prefix)
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self._tmp = [Path(f"{p}.tmp") for p in (self.bin_path, self.idx_path)]
        self.bin_path.parent.mkdir(parents=True, exist_ok=True)
        self._bin = open(self._tmp[0], "wb")  # noqa: SIM115 (closed by finish/abort)
        self.lengths: list[int] = []

    def __enter__(self) -> IndexedWriter:
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is not None:
            self.abort()

    def add_document(self, tokens) -> None:
        """One document as one sequence: the document indices gain one entry per call."""
        array = np.asarray(tokens)
        if array.size and (array.min() < 0 or array.max() > np.iinfo(self.dtype).max):
            raise ValueError(f"token ids {array.min()}..{array.max()} do not fit {self.dtype.name}")
        self._bin.write(array.astype(self.dtype, copy=False).tobytes(order="C"))
        self.lengths.append(int(array.size))

    def finish(self) -> None:
        self._bin.close()
        n = len(self.lengths)
        lengths = np.asarray(self.lengths, dtype="<i4")
        ends = np.cumsum(lengths.astype("<i8")) * self.dtype.itemsize
        pointers = np.concatenate(([0], ends[:-1])).astype("<i8") if n else np.empty(0, "<i8")
        code = next(c for c, t in DTYPE_CODES.items() if np.dtype(t) == self.dtype)
        with open(self._tmp[1], "wb") as f:
            f.write(_HEADER.pack(MAGIC, VERSION, code, n, n + 1))
            f.write(lengths.tobytes())
            f.write(pointers.tobytes())
            f.write(np.arange(n + 1, dtype="<i8").tobytes())
        for tmp, final in zip(self._tmp, (self.bin_path, self.idx_path), strict=True):
            os.replace(tmp, final)

    def abort(self) -> None:
        self._bin.close()
        for tmp in self._tmp:
            tmp.unlink(missing_ok=True)
