"""What a run trains on, as a record every checkpoint manifest keeps and every resume compares.

A run resumed or requeued on other data than its checkpoint's continues another experiment without
a word (issue 26: text to a loss of 3.418 at step 100, then synthetic tokens at 6.247 at step 101).
So the manifest of each checkpoint (train/checkpoint/store.py) carries the fingerprint of the data it
was trained on, and the entrypoint refuses to resume on data whose fingerprint differs unless told
to switch on purpose (``--switch-data``, recorded in the next manifest).

What is hashed, for each dataset prefix P (dsorch's token file P.bin + P.json, or Megatron-LM's
indexed dataset P.bin + P.idx):

- the index whole (P.idx, or the token file's P.json): small (the .idx is a header plus ~10 bytes
  per document, megatron/core/datasets/indexed_dataset.py _IndexWriter; the .json a few hundred
  bytes) and it pins the documents' lengths; the token file's .json also holds the sha256 of its
  whole .bin, taken when scripts/make_token_file.py wrote it.
- the .bin's size and the sha256 of its first and last MiB, not the whole file: a corpus's .bin
  runs to hundreds of GB, and hashing it at every start would cost minutes (100 GB at 1 GB/s is
  100 s) before the first step. Size, both ends and the index catch another corpus, another
  tokenizer's ids, a truncated or appended file; what they miss is an edit inside the middle that
  keeps the size and every document length, which no tokenizer run makes.
- not the mtime: copying the data to node-local scratch or another filesystem changes it, and a
  run must resume on the same bytes from a new place. Paths are recorded but not compared, for
  the same reason.

Synthetic data has a fingerprint too: its vocabulary and seed are all that make its samples.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from orchestrator.train.checkpoint.store import sha256_of
from orchestrator.train.data.indexed import dataset_paths
from orchestrator.train.data.prepare import tokenizer_json

# How much of each end of a .bin is hashed.
END_BYTES = 1 << 20
# The suffixes of a dataset's files; a prefix given with one of them names the same dataset.
_SUFFIXES = (".bin", ".idx", ".json")


def prefix_of(path: str | Path) -> Path:
    """A dataset's prefix: ``data/books`` for data/books, data/books.bin or data/books.idx."""
    p = Path(path)
    return p.with_suffix("") if p.suffix in _SUFFIXES else p


def _ends_sha256(path: Path, size: int) -> str:
    """sha256 of the first END_BYTES and the last END_BYTES of the file (the whole file when it is
    shorter than both together)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        if size <= 2 * END_BYTES:
            h.update(f.read())
        else:
            h.update(f.read(END_BYTES))
            f.seek(size - END_BYTES)
            h.update(f.read(END_BYTES))
    return h.hexdigest()


def dataset_record(prefix: str | Path, weight: float | None) -> dict:
    """One dataset's part of the fingerprint; its files must exist (the dataset was opened)."""
    p = prefix_of(prefix)
    bin_path, index = dataset_paths(p)
    if not index.is_file():  # a legacy token file: its .json sidecar is its index
        index = Path(f"{p}.json")
    size = bin_path.stat().st_size
    return {
        "prefix": str(p),
        "weight": weight,
        "bin_bytes": size,
        "bin_ends_sha256": _ends_sha256(bin_path, size),
        "index": index.suffix[1:],
        "index_sha256": sha256_of(index),
    }


def tokenizer_record(tokenizer, base: Path) -> dict:
    """training.data.tokenizer, with the sha256 of its file when it is one here: the file itself,
    or a directory's tokenizer.json (a Hugging Face tokenizer). A hub name has none."""
    rec: dict = {"type": tokenizer.type, "model": tokenizer.model, "sha256": None}
    if tokenizer.model is not None:
        p = tokenizer_json(base / tokenizer.model)
        if p.is_file():
            rec["sha256"] = sha256_of(p)
    return rec


def fingerprint(
    datasets: list[tuple[float | None, str]], *, split: str, tokenizer, base: Path, vocab_size: int, seed: int
) -> dict:
    """The fingerprint of a run's data: ``datasets`` is the blend (weight, prefix) it reads, empty
    for synthetic tokens; ``base`` the directory relative tokenizer paths start from."""
    if not datasets:
        return {"kind": "synthetic", "vocab_size": vocab_size, "seed": seed}
    return {
        "kind": "files",
        "datasets": [dataset_record(prefix, weight) for weight, prefix in datasets],
        "split": split,
        "tokenizer": tokenizer_record(tokenizer, base),
    }


def describe(fp: dict) -> str:
    """A fingerprint in a few words, for the log and for the refusal."""
    if fp["kind"] == "synthetic":
        return f"synthetic tokens (vocab {fp['vocab_size']}, seed {fp['seed']})"
    parts = [d["prefix"] + (f" (weight {d['weight']:g})" if d["weight"] is not None else "") for d in fp["datasets"]]
    tok = fp["tokenizer"]
    return f"{', '.join(parts)}; split {fp['split']}; tokenizer {tok['type']}" + (
        f" {tok['model']}" if tok["model"] else ""
    )


_KINDS = {"synthetic": "synthetic tokens", "files": "dataset files"}
_DATASET_FACTS = (
    ("bin_bytes", "size of .bin"),
    ("bin_ends_sha256", "first/last MiB of .bin"),
    ("index_sha256", "index"),
    ("weight", "weight"),
)


def differences(old: dict, new: dict) -> list[str]:
    """What differs between the checkpoint's fingerprint ``old`` and this start's ``new``, each as
    a phrase; empty when they name the same data (paths aside: a moved copy is the same data)."""
    if old["kind"] != new["kind"]:
        return [f"{_KINDS[old['kind']]} -> {_KINDS[new['kind']]}"]
    if old["kind"] == "synthetic":
        return [f"{key} {old[key]} -> {new[key]}" for key in ("vocab_size", "seed") if old[key] != new[key]]
    out = []
    if len(old["datasets"]) != len(new["datasets"]):
        out.append(f"{len(old['datasets'])} dataset(s) -> {len(new['datasets'])}")
    for i, (a, b) in enumerate(zip(old["datasets"], new["datasets"], strict=False)):
        changed = [what for key, what in _DATASET_FACTS if a.get(key) != b.get(key)]
        if changed:
            out.append(f"dataset {i + 1} ({a['prefix']} -> {b['prefix']}): {', '.join(changed)} differ")
    if old["split"] != new["split"]:
        out.append(f"split {old['split']} -> {new['split']}")
    ta, tb = old["tokenizer"], new["tokenizer"]
    # The same file (by sha256) wherever it lies; without one (a hub name), the same name.
    same_file = ta["sha256"] == tb["sha256"] and (ta["sha256"] is not None or ta["model"] == tb["model"])
    if ta["type"] != tb["type"] or not same_file:
        out.append(
            f"tokenizer {ta['type']} {ta['model'] or ''} (sha256 {str(ta['sha256'])[:12]}) -> "
            f"{tb['type']} {tb['model'] or ''} (sha256 {str(tb['sha256'])[:12]})"
        )
    return out


def refusal(checkpoint: Path, old: dict, new: dict, changed: list[str]) -> str:
    """The one paragraph a resume on other data gets."""
    return (
        f"{checkpoint} was trained on {describe(old)}; this start would train on {describe(new)} "
        f"({'; '.join(changed)}). Resuming would continue the run on other data. Train on the "
        "checkpoint's data again (the same --data, or the plan's training.data), or pass --switch-data "
        "to continue on this data on purpose (the switch is recorded in the next checkpoint's manifest)."
    )


def run_data(data_arg: str | None, data_spec, plan_dir: Path):
    """(source, blend, origin): what open_dataset reads, the (weight, prefix) list it blends, and
    where it came from. ``--data`` wins when given; else training.data.path with relative prefixes
    made absolute against the plan directory (launch.sh runs Megatron-LM from there, so one spec
    names the same files under both runtimes); else synthetic tokens (source None)."""
    if data_arg is not None:
        return data_arg, [(None, data_arg)], "--data"
    if data_spec.path is None:
        return None, [], "synthetic: the plan's training.data names no path"
    pairs = [(w, str(plan_dir / p)) for w, p in data_spec.blend()]  # an absolute p stays as it is
    weighted = pairs[0][0] is not None
    # The weights as the spec writes them (Megatron-LM parses the same words), the prefixes made absolute.
    words = (
        [w for i, (_, p) in enumerate(pairs) for w in (data_spec.path[2 * i], p)] if weighted else [p for _, p in pairs]
    )
    return data_spec.model_copy(update={"path": tuple(words)}), pairs, "the plan's training.data"


def resume_check(tag_dir: Path, manifest: dict, new: dict, switch: bool) -> tuple[str | None, dict | None, str]:
    """Whether a start on data ``new`` may resume from the checkpoint in ``tag_dir``: (refusal or
    None, the switch to record in the next manifests or None, a line for the log or '')."""
    old = manifest.get("data")
    if old is None:
        return None, None, f"{tag_dir} records no data fingerprint (written before dsorch kept one); not compared"
    changed = differences(old, new)
    if not changed:
        return None, None, ""
    if not switch:
        return refusal(tag_dir, old, new, changed), None, ""
    switched = {"at_step": manifest["step"], "from": old, "changed": changed}
    return (
        None,
        switched,
        (
            f"switching data on purpose (--switch-data) at step {manifest['step']}: {describe(old)} -> "
            f"{describe(new)} ({'; '.join(changed)}); recorded in the next checkpoint's manifest"
        ),
    )
