"""Text to a Megatron-LM indexed dataset (``dsorch data prepare``): the job of Megatron-LM's
tools/preprocess_data.py, with a Hugging Face tokenizer read from a local tokenizer.json.

Each document is tokenized (the tokenizer's own special tokens included, as Hugging Face's
``tokenizer(text)`` and Megatron-LM's HuggingFaceTokenizer give them) and followed by the
end-of-document token (preprocess_data.py --append-eod), then written as one sequence of one
document (orchestrator/train/data/indexed.py). Worker processes tokenize batches of documents; the
batches are written in input order, so the files are the same whatever the number of workers.
Output is atomic: nothing is renamed into place before the last document is written.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np

from orchestrator.errors import InvalidFile
from orchestrator.train.data.indexed import IndexedWriter, dataset_paths, token_dtype

FORMATS = ("auto", "jsonl", "text", "parquet")
# End-of-document tokens of the common tokenizers, tried in this order when --eod-token is not given:
# GPT-2 / Qwen2, Llama 3, Llama 2 / Mistral, Gemma.
EOD_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
BATCH = 256  # documents per batch a worker tokenizes


@dataclass(frozen=True, kw_only=True, slots=True)
class Source:
    """Where the documents come from and how each file is read."""

    paths: tuple[Path, ...]
    format: str = "auto"
    key: str = "text"  # the jsonl key or parquet column
    per_line: bool = False  # plain text: one document per line instead of per file


@dataclass(frozen=True, kw_only=True, slots=True)
class Prepared:
    """What `prepare` wrote."""

    bin_path: Path
    idx_path: Path
    documents: int
    tokens: int
    dtype: str
    vocab_size: int
    eod_id: int


def file_format(path: Path, given: str) -> str:
    if given != "auto":
        return given
    suffixes = path.suffixes
    if ".parquet" in suffixes:
        return "parquet"
    return "jsonl" if ".jsonl" in suffixes or ".json" in suffixes or ".ndjson" in suffixes else "text"


def _jsonl(path: Path, key: str) -> Iterator[str]:
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise InvalidFile(f"{path}:{n}: not a JSON object ({e}); fix or remove the line") from e
            if not isinstance(record, dict) or not isinstance(record.get(key), str):
                what = f"has no string under key {key!r}" if isinstance(record, dict) else "is not a JSON object"
                keys = f" (its keys: {', '.join(sorted(record))})" if isinstance(record, dict) else ""
                raise InvalidFile(f"{path}:{n}: the line {what}{keys}; fix the line or name the key with --key")
            yield record[key]


def _text(path: Path, per_line: bool) -> Iterator[str]:
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        lineno = data[: e.start].count(b"\n") + 1
        raise InvalidFile(f"{path}:{lineno}: not UTF-8 (byte {e.start}: {e.reason}); convert the file to UTF-8") from e
    if not per_line:
        yield text
        return
    for line in text.splitlines():
        if line.strip():
            yield line


def _parquet(path: Path, column: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise InvalidFile(
            f"{path}: reading parquet needs pyarrow; install it with `pip install 'dsorch[parquet]'`"
        ) from e
    try:
        table = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises its own ArrowInvalid for a file that is not parquet
        raise InvalidFile(f"{path}: not a parquet file ({e})") from e
    if column not in table.schema_arrow.names:
        raise InvalidFile(
            f"{path}: no column {column!r} (columns: {', '.join(table.schema_arrow.names)}); name it with --key"
        )
    row = 0
    for batch in table.iter_batches(columns=[column]):
        for value in batch.column(0).to_pylist():
            row += 1
            if not isinstance(value, str):
                raise InvalidFile(f"{path}: row {row}: column {column!r} is {type(value).__name__}, not text")
            yield value


def documents(source: Source) -> Iterator[str]:
    """Every document of every input file, in order."""
    for path in source.paths:
        if not path.is_file():
            raise InvalidFile(f"{path}: no such file; give the input files to prepare")
        kind = file_format(path, source.format)
        if kind == "jsonl":
            yield from _jsonl(path, source.key)
        elif kind == "parquet":
            yield from _parquet(path, source.key)
        else:
            yield from _text(path, source.per_line)


def tokenizer_json(path: Path) -> Path:
    """The tokenizer.json a path names: the file itself, or the one in a model directory."""
    return path / "tokenizer.json" if path.is_dir() else path


def load_tokenizer(path: Path):
    """A Hugging Face tokenizer from its tokenizer.json (the `tokenizers` library; no hub access)."""
    from tokenizers import Tokenizer

    path = tokenizer_json(path)
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a plain Exception for a missing or unreadable file
        raise InvalidFile(
            f"{path}: not a Hugging Face tokenizer.json ({e}); give the tokenizer.json of the model"
        ) from e


def eod_id(tokenizer, path: Path, name: str | None) -> int:
    """The id of the end-of-document token: `name`, else the first of EOD_CANDIDATES it knows."""
    for candidate in (name,) if name else EOD_CANDIDATES:
        token_id = tokenizer.token_to_id(candidate)
        if token_id is not None:
            return int(token_id)
    tried = name or ", ".join(EOD_CANDIDATES)
    raise InvalidFile(f"{path}: the tokenizer has no end-of-document token {tried}; name one with --eod-token")


_WORKER: dict = {}


def _init_worker(path: str, eod: int, threads: bool = True) -> None:
    if not threads:
        # One thread per worker process: --workers is the parallelism (tokenizers reads this variable
        # before each batch; unset, every worker would start a thread per core).
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER["tokenizer"], _WORKER["eod"] = load_tokenizer(Path(path)), eod


def _encode(batch: list[str]) -> tuple[int, list[np.ndarray]]:
    """One batch of documents, each tokenized and followed by the end-of-document token; and its characters."""
    encodings = _WORKER["tokenizer"].encode_batch(batch)
    return sum(map(len, batch)), [np.asarray([*e.ids, _WORKER["eod"]], dtype=np.int64) for e in encodings]


def _batches(docs: Iterator[str]) -> Iterator[list[str]]:
    while batch := list(islice(docs, BATCH)):
        yield batch


def prepare(
    source: Source,
    tokenizer_path: Path,
    prefix: str,
    *,
    eod_token: str | None = None,
    workers: int = 1,
    max_vocab: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> Prepared:
    """Tokenize `source` into PREFIX.bin + PREFIX.idx. `max_vocab`: the model's vocabulary size, which
    the tokenizer's must not exceed. `progress` is called with the characters of each batch read."""
    tokenizer = load_tokenizer(tokenizer_path)
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    if max_vocab is not None and vocab > max_vocab:
        raise InvalidFile(
            f"{tokenizer_path}: the tokenizer's vocabulary has {vocab} tokens, more than the model's vocab_size "
            f"{max_vocab}; use the model's tokenizer or raise model.vocab_size in the spec"
        )
    eod = eod_id(tokenizer, tokenizer_path, eod_token)
    _init_worker(str(tokenizer_path), eod)
    dtype = token_dtype(vocab)
    batches = _batches(documents(source))
    n_docs = n_tokens = 0
    encoded: Iterator[tuple[int, list[np.ndarray]]]
    with IndexedWriter(prefix, dtype) as writer:
        if workers > 1:
            # spawn, not fork: the parent may run a progress-bar thread, and a forked child inherits its locks.
            ctx = multiprocessing.get_context("spawn")
            pool = ctx.Pool(workers, initializer=_init_worker, initargs=(str(tokenizer_path), eod, False))
            encoded = pool.imap(_encode, batches)  # imap keeps input order: the same files for any count
        else:
            pool, encoded = None, map(_encode, batches)
        try:
            for chars, batch in encoded:
                if progress:
                    progress(chars)
                for doc in batch:
                    writer.add_document(doc)
                    n_docs, n_tokens = n_docs + 1, n_tokens + len(doc)
        finally:
            if pool is not None:
                pool.terminate()
        writer.finish()
    bin_path, idx_path = dataset_paths(prefix)
    return Prepared(
        bin_path=bin_path,
        idx_path=idx_path,
        documents=n_docs,
        tokens=n_tokens,
        dtype=np.dtype(dtype).name,
        vocab_size=vocab,
        eod_id=eod,
    )
