"""Training data: deterministic synthetic tokens or a token file, addressed by sample index.

Sample ``i`` is a pure function of ``i`` (and the seed), and the global batch of step ``t`` is
samples ``t * gbs .. t * gbs + gbs - 1`` whatever the layout. A data-parallel rank takes its
micro-batches from that range by a fixed rule, so every layout sees the same sequences in the
same step (what the equivalence tests compare), and a resumed run needs only the step number
to continue the stream exactly.

Token file format (written by scripts/make_token_file.py)::

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
from pathlib import Path

import numpy as np
import torch

from orchestrator.errors import InvalidFile

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


class TokenFile:
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
        self.num_windows = (len(self.tokens) - 1) // seq_length
        if self.num_windows < 1:
            raise InvalidFile(f"{bin_path}: {len(self.tokens)} tokens, fewer than one sequence of {seq_length + 1}")
        # The current epoch's order of windows; epoch -1: none drawn yet.
        self._perm_epoch, self._perm = -1, np.empty(0, dtype=np.int64)

    def sample(self, index: int) -> np.ndarray:
        epoch, i = divmod(index, self.num_windows)
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_windows)
            self._perm_epoch = epoch
        start = int(self._perm[i]) * self.seq_length
        return np.asarray(self.tokens[start : start + self.seq_length + 1], dtype=np.int64)

    def describe(self) -> str:
        return f"{self.path} ({len(self.tokens):,} tokens, {self.num_windows:,} windows)"


def open_dataset(path: str | None, vocab_size: int, seq_length: int, seed: int, split: str = "train"):
    """The samples of one part (``SPLITS``) of the data: synthetic without a path."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: one of {', '.join(SPLITS)}")
    if path is None:
        return SyntheticTokens(vocab_size, seq_length, seed, split)
    return TokenFile(path, vocab_size, seq_length, seed)


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
