"""Training data, addressed by sample index: deterministic synthetic tokens, Megatron-LM indexed
datasets (PREFIX.bin + PREFIX.idx, blended and split as the spec's training.data gives them to
Megatron-LM; orchestrator/train/data/indexed.py reads them), or dsorch's legacy token file.

Sample ``i`` is a pure function of ``i`` (and the seed), and the global batch of step ``t`` is
samples ``t * gbs .. t * gbs + gbs - 1`` whatever the layout. A data-parallel rank takes its
micro-batches from that range by a fixed rule, so every layout sees the same sequences in the
same step (what the equivalence tests compare), and a resumed run needs only the step number
to continue the stream exactly.

Legacy token file format (written by scripts/make_token_file.py; still read, `dsorch data prepare`
writes indexed datasets instead)::

    NAME.bin    the token ids, one after another, as a flat little-endian array (no header),
                documents separated by the end-of-text id if the vocabulary has one
    NAME.json   {"format": "dsorch-tokens-v1", "dtype": "uint16", "vocab_size": 256,
                 "num_tokens": N, "tokenizer": "bytes", ...}

dtype is uint16 (vocabularies up to 65,536) or uint32. The .bin file is memory-mapped, so a
file of any size costs no RAM. A sample is a window of seq_length + 1 tokens at a start offset
chosen by a seeded permutation of all non-overlapping windows (reshuffled each epoch).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import torch

from orchestrator.errors import InvalidFile
from orchestrator.spec.training import parse_blend
from orchestrator.train.data.indexed import IndexedDataset, dataset_paths, is_indexed

TOKEN_FORMAT = "dsorch-tokens-v1"
# Megatron-LM's three parts of a dataset (--split train,valid,test).
SPLITS = ("train", "valid", "test")


class SyntheticTokens:
    """Learnable synthetic sequences: x_k = (a + b*k) mod V with (a, b) drawn per sample.

    A model can learn the rule from context, so the loss falls and a training bug shows.
    """

    def __init__(self, vocab_size: int, seq_length: int, seed: int, split: str = "train"):
        self.vocab_size, self.seq_length, self.seed = vocab_size, seq_length, seed
        # The training part keeps the key it always had (resumed runs draw the same samples); the
        # validation and test parts draw from streams of their own.
        self._key = (seed,) if split == "train" else (seed, SPLITS.index(split))

    def sample(self, index: int) -> np.ndarray:
        rng = np.random.default_rng([*self._key, index])
        a, b = rng.integers(0, self.vocab_size), rng.integers(1, 8)
        return (a + b * np.arange(self.seq_length + 1)) % self.vocab_size

    def describe(self) -> str:
        return f"synthetic arithmetic sequences (vocab {self.vocab_size})"


class Windows:
    """Non-overlapping windows of seq_length + 1 tokens over a flat token array (neighbours share the
    token at the seam), in an order a seeded permutation reshuffles every epoch: sample ``i`` is a
    pure function of ``i`` and ``key``."""

    def __init__(self, tokens: np.ndarray, seq_length: int, key: tuple[int, ...]):
        self.tokens, self.seq_length, self.key = tokens, seq_length, key
        self.num_windows = max(0, (len(tokens) - 1) // seq_length)
        # The current epoch's order of windows; epoch -1: none drawn yet.
        self._perm_epoch, self._perm = -1, np.empty(0, dtype=np.int64)

    def sample(self, index: int) -> np.ndarray:
        epoch, i = divmod(index, self.num_windows)
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([*self.key, epoch]).permutation(self.num_windows)
            self._perm_epoch = epoch
        start = int(self._perm[i]) * self.seq_length
        return np.asarray(self.tokens[start : start + self.seq_length + 1], dtype=np.int64)


class TokenFile:
    """dsorch's legacy token file (the format above); kept readable as it was."""

    def __init__(self, path: str | Path, vocab_size: int, seq_length: int, seed: int):
        path = Path(path)
        bin_path, meta_path = path.with_suffix(".bin"), path.with_suffix(".json")
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except FileNotFoundError as e:
            raise InvalidFile(
                f"--data {path}: {meta_path} is missing; token files come in "
                "pairs NAME.bin + NAME.json (scripts/make_token_file.py)"
            ) from e
        except json.JSONDecodeError as e:
            raise InvalidFile(
                f"{meta_path}:{e.lineno}: not valid JSON ({e.msg}); regenerate it with scripts/make_token_file.py"
            ) from e
        if meta.get("format") != TOKEN_FORMAT:
            raise InvalidFile(f"{meta_path}: format {meta.get('format')!r}, expected {TOKEN_FORMAT!r}")
        if int(meta["vocab_size"]) > vocab_size:
            raise InvalidFile(
                f"{meta_path}: vocab_size {meta['vocab_size']} exceeds the model's "
                f"{vocab_size}; tokenize for this model or plan a larger vocabulary"
            )
        self.tokens = np.memmap(bin_path, dtype=np.dtype(meta["dtype"]).newbyteorder("<"), mode="r")
        if len(self.tokens) != int(meta["num_tokens"]):
            raise InvalidFile(
                f"{bin_path}: {len(self.tokens)} tokens, the sidecar says "
                f"{meta['num_tokens']}; the pair is damaged, regenerate it"
            )
        self.seq_length, self.seed, self.path = seq_length, seed, path
        self._windows = Windows(self.tokens, seq_length, (seed,))
        self.num_windows = self._windows.num_windows
        if self.num_windows < 1:
            raise InvalidFile(f"{bin_path}: {len(self.tokens)} tokens, fewer than one sequence of {seq_length + 1}")

    def sample(self, index: int) -> np.ndarray:
        return self._windows.sample(index)

    def describe(self) -> str:
        return f"{self.path} ({len(self.tokens):,} tokens, {self.num_windows:,} windows)"


def blend_from_list(items: list[str], where: str = "training.data.path") -> tuple[list[str], list[float] | None]:
    """Megatron-LM's --data-path list as prefixes and normalized weights (None: unweighted):
    spec.training.parse_blend, then megatron/core/datasets/utils.py normalize (weights / their sum)."""
    try:
        pairs = parse_blend(items, where)
    except ValueError as e:
        raise InvalidFile(str(e)) from None
    prefixes = [prefix for _, prefix in pairs]
    if pairs and pairs[0][0] is None:
        return prefixes, None
    total = sum(float(w or 0) for w, _ in pairs)
    return prefixes, [float(w or 0) / total for w, _ in pairs]


def split_bounds(split: str) -> list[tuple[float, float] | None]:
    """Each part's share of a dataset's documents as (start, end) fractions; None: no share.

    megatron/core/datasets/blended_megatron_dataset_config.py parse_and_normalize_split (numbers,
    padded with zeros to three, normalized) and convert_split_vector_to_split_matrix (running sums;
    an empty range is None).
    """
    shares = [float(x) for x in re.findall(r"[.0-9]+", split)]
    shares += [0.0] * (len(SPLITS) - len(shares))
    total = sum(shares)
    if len(shares) != len(SPLITS) or total <= 0:
        raise InvalidFile(f"training.data.split {split!r}: give up to three non-negative numbers, not all zero")
    edges = [0.0]
    for share in shares:
        edges.append(edges[-1] + share / total)
    return [(lo, hi) if hi > lo else None for lo, hi in zip(edges[:-1], edges[1:], strict=True)]


def _checked_dataset(prefix: str, vocab_size: int) -> IndexedDataset:
    """An indexed dataset whose largest token id fits the model's vocabulary. The check scans the
    .bin once per process: from the page cache 0.01 s per 1e8 uint16 tokens and 0.02 s per 1e8
    int32 tokens on a 2-core machine (IndexedDataset.max_token); a cold file costs one read of it."""
    ds = IndexedDataset(prefix)
    # A dtype that cannot hold the vocabulary's last id needs no scan.
    if np.issubdtype(ds.dtype, np.integer) and np.iinfo(ds.dtype).max < vocab_size:
        return ds
    if not np.issubdtype(ds.dtype, np.integer):
        raise InvalidFile(f"{ds.idx_path}: token dtype {ds.dtype.name}; token ids are integers, {_PREPARE}")
    top = _max_token(str(ds.bin_path.resolve()), ds.bin_path.stat().st_mtime_ns, ds)
    if top >= vocab_size:
        raise InvalidFile(
            f"{ds.bin_path}: token id {top} is outside the model's vocabulary of {vocab_size}; tokenize with the "
            f"model's tokenizer ({_PREPARE}) or plan a larger vocab_size"
        )
    return ds


_MAX_TOKENS: dict[tuple[str, int], int] = {}
_PREPARE = "`dsorch data prepare --spec SPEC.yaml` checks the tokenizer against the model"


def _max_token(path: str, mtime: int, ds: IndexedDataset) -> int:
    """The file's largest token id, scanned once per process (the parts of one run share it)."""
    if (path, mtime) not in _MAX_TOKENS:
        _MAX_TOKENS[(path, mtime)] = ds.max_token()
    return _MAX_TOKENS[(path, mtime)]


class Blend:
    """Which dataset, and which of its samples, blended sample ``i`` is: a pure function of ``i``.

    Dataset d's k-th sample stands at time (k + 0.5) / w_d and the blend takes samples in time order,
    ties to the lower dataset (Webster / Sainte-Lague apportionment): after any n samples dataset d
    has given about w_d * n of them (within one for two datasets), as Megatron-LM's greedy rule does
    (megatron/core/datasets/helpers.cpp build_blending_indices), without walking from sample 0.
    The order is computed in blocks of ``BLOCK`` samples, each from the counts at its start.
    """

    BLOCK = 4096

    def __init__(self, weights: list[float]):
        self.w = [float(w) for w in weights]
        self._block, self._dataset, self._index = -1, np.empty(0, np.int64), np.empty(0, np.int64)

    def _before(self, e: int, j: int, t: float, d: int) -> bool:
        key = (j + 0.5) / self.w[e]
        return key < t or (key == t and e < d)

    def _rank(self, d: int, k: int) -> int:
        """How many samples come before dataset d's k-th."""
        t, rank = (k + 0.5) / self.w[d], k
        for e in range(len(self.w)):
            if e != d:
                j = max(0, int(t * self.w[e] - 0.5))
                while j > 0 and not self._before(e, j - 1, t, d):
                    j -= 1
                while self._before(e, j, t, d):
                    j += 1
                rank += j
        return rank

    def _counts(self, start: int) -> list[int]:
        """Each dataset's number of samples among the first `start`."""
        counts = []
        for d in range(len(self.w)):
            lo, hi = 0, start  # the first k whose rank is >= start
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (mid + 1, hi) if self._rank(d, mid) < start else (lo, mid)
            counts.append(lo)
        return counts

    def __call__(self, index: int) -> tuple[int, int]:
        block, i = divmod(index, self.BLOCK)
        if block != self._block:
            ks = [np.arange(c, c + self.BLOCK, dtype=np.int64) for c in self._counts(block * self.BLOCK)]
            keys = np.concatenate([(k + 0.5) / w for k, w in zip(ks, self.w, strict=True)])
            ids = np.repeat(np.arange(len(self.w)), self.BLOCK)
            order = np.lexsort((ids, keys))[: self.BLOCK]
            self._block, self._dataset, self._index = block, ids[order], np.concatenate(ks)[order]
        return int(self._dataset[i]), int(self._index[i])


class BlendedData:
    """One part (train, valid or test) of Megatron-LM indexed datasets, blended by weight.

    Follows Megatron-LM's GPT dataset in what it samples: each dataset's sequences (documents) are
    split into contiguous ranges by the normalized --split proportions, round(share * count) at each
    edge (megatron/core/datasets/blended_megatron_dataset_builder.py _build_megatron_dataset_splits),
    a sample is seq_length + 1 consecutive tokens that may run across documents (they are
    concatenated, each ending with its end-of-document token), and datasets are blended by their
    normalized weights, or by their sizes without weights (BlendedMegatronDatasetBuilder.build).
    The sample order is dsorch's own, seeded: windows in a per-epoch permutation (``Windows``) and
    the ``Blend`` rule, not Megatron's shuffled document index, so the same documents and proportions
    are used but not in Megatron's order.
    """

    def __init__(self, items: list[str], split_text: str, vocab_size: int, seq_length: int, seed: int, split: str):
        prefixes, weights = blend_from_list(items)
        part = SPLITS.index(split)
        bounds = split_bounds(split_text)[part]
        if bounds is None:
            raise InvalidFile(
                f"training.data.split {split_text!r} gives the {split} part no share of the data; "
                f"give it a non-zero proportion (train,valid,test)"
            )
        self.split, self.parts, self.prefixes = split, [], prefixes
        for d, prefix in enumerate(prefixes):
            ds = _checked_dataset(prefix, vocab_size)
            beg, end = (int(round(b * len(ds))) for b in bounds)
            first = int(ds.starts[beg]) if beg < len(ds) else ds.num_tokens
            last = int(ds.starts[end - 1] + ds.sequence_lengths[end - 1]) if end > beg else first
            windows = Windows(ds.tokens[first:last], seq_length, (seed, part, d))
            if windows.num_windows < 1:
                raise InvalidFile(
                    f"{ds.bin_path}: its {split} part (documents {beg}..{end} of {len(ds)} by split "
                    f"{split_text!r}) has {last - first} tokens, fewer than one sample of {seq_length + 1}; "
                    f"use more data or give the {split} part a larger share"
                    + (" (or set training.data.eval_iters to 0: no validation)" if split == "valid" else "")
                )
            self.parts.append(windows)
        sizes = [part.num_windows for part in self.parts]
        self.weights = weights or [size / sum(sizes) for size in sizes]
        self.blend = Blend(self.weights)

    def sample(self, index: int) -> np.ndarray:
        d, i = self.blend(index)
        return self.parts[d].sample(i)

    def describe(self) -> str:
        parts = ", ".join(
            f"{w:.3g} {p} ({part.num_windows:,} windows)"
            for w, p, part in zip(self.weights, self.prefixes, self.parts, strict=True)
        )
        return f"indexed {self.split} part: {parts}"


def open_dataset(source, vocab_size: int, seq_length: int, seed: int, split: str = "train"):
    """The samples of one part (``SPLITS``) of the data.

    ``source`` is one of:

    - None, or a DataSpec without a path: synthetic tokens (Megatron-LM's --mock-data);
    - a DataSpec (the spec's ``training.data``): its ``path`` is Megatron-LM's --data-path list,
      prefixes each optionally preceded by its weight, and its ``split`` is --split;
    - a list of strings: a --data-path list, with DataSpec's default split;
    - a string: an indexed-dataset prefix (PREFIX.bin + PREFIX.idx), a legacy dsorch token file
      NAME (NAME.bin + NAME.json, still read as before: it has no parts, so every part is the
      whole file), or several words, read as a --data-path list ("0.3 a 0.7 b").

    Relative paths are relative to the current directory, as Megatron-LM opens them.
    """
    from orchestrator.spec.training import DataSpec

    if split not in SPLITS:
        raise ValueError(f"split {split!r}: one of {', '.join(SPLITS)}")
    if source is None or (isinstance(source, DataSpec) and source.path is None):
        return SyntheticTokens(vocab_size, seq_length, seed, split)
    spec_split = DataSpec.model_fields["split"].default
    if isinstance(source, DataSpec):
        items, spec_split = list(source.path or ()), source.split
    elif isinstance(source, str | Path):
        text = str(source)
        legacy = Path(text).with_suffix(".json").exists() and not dataset_paths(text)[1].exists()
        if legacy:
            return TokenFile(text, vocab_size, seq_length, seed)
        if is_indexed(text) or len(text.split()) < 2:
            items = [text]  # an indexed dataset, or the reader's error naming both halves
        else:
            items = text.split()
    else:
        items = [str(item) for item in source]
    return BlendedData(items, spec_split, vocab_size, seq_length, seed, split)


def micro_batches(dataset, step: int, gbs: int, mbs: int, dp: int, dp_rank: int):
    """The (inputs, labels) micro-batches of one step on one data-parallel rank.

    Micro-batch m of dp rank r holds samples step*gbs + (m*dp + r)*mbs + k, k < mbs: together
    the dp ranks' gas micro-batches cover the step's gbs samples exactly once.
    """
    gas = gbs // (mbs * dp)
    for m in range(gas):
        first = step * gbs + (m * dp + dp_rank) * mbs
        seqs = torch.from_numpy(np.stack([dataset.sample(first + k) for k in range(mbs)]))
        yield seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()
