"""Checkpoints: DeepSpeed's save_checkpoint / load_checkpoint plus a manifest, retention and
a fallback when the newest checkpoint is damaged.

Layout under RUN_DIR/checkpoints/: one directory per checkpoint, ``step00000030/``, written by
DeepSpeed (every rank that owns a pipeline stage, a tp slice or a ZeRO shard writes its own
files -- that is how DeepSpeed checkpoints, and the one exception to "only rank 0 writes").
Once every rank has finished, rank 0 adds ``dsorch_manifest.json`` (size and sha256 of each
file). A directory without a manifest (a save interrupted by a crash) or whose files no longer
match it is skipped at resume with a warning, and the previous checkpoint is used. Rank 0 alone
decides which checkpoint to load and tells the others, so all ranks load the same one.

Hashing reads every file once per save; at tiny and medium sizes that is seconds. For
multi-hundred-GB checkpoints this is the cost to watch.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path

import torch.distributed as dist

# The universal copy of checkpoint ``step00000030`` is ``universal_step00000030`` in the same
# checkpoints directory: not ``step*``, so that retention and the native resume never take it for
# a native checkpoint.
UNIVERSAL_PREFIX = "universal_"
MANIFEST = "dsorch_manifest.json"


def tag_for(step: int) -> str:
    return f"step{step:08d}"


def sha256_of(path: Path) -> str:
    """The sha256 of a whole file, read in chunks."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def file_digests(tag_dir: Path) -> dict[str, dict]:
    out = {}
    for p in sorted(tag_dir.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            out[str(p.relative_to(tag_dir))] = {"bytes": p.stat().st_size, "sha256": sha256_of(p)}
    return out


def damage(tag_dir: Path) -> str | None:
    """Why a checkpoint directory cannot be trusted, or None if it is intact."""
    man = tag_dir / MANIFEST
    if not man.is_file():
        return "no manifest (the save did not finish)"
    try:
        expected = json.loads(man.read_text(encoding="utf-8"))["files"]
    except (ValueError, KeyError) as e:
        return f"unreadable manifest ({e})"
    actual = file_digests(tag_dir)
    for name, rec in expected.items():
        if name not in actual:
            return f"{name} is missing"
        if actual[name] != rec:
            return f"{name} differs from the manifest (size or sha256)"
    return None


def save(
    engine,
    ckpt_dir: Path,
    step: int,
    keep: int,
    is_rank0: bool,
    *,
    layout: dict | None = None,
    plan: str | None = None,
    universal_info: dict | None = None,
    data: dict | None = None,
    data_switched: dict | None = None,
) -> None:
    """``layout`` and ``plan`` go into the manifest (which layout wrote it, from which plan
    directory: `dsorch replan` reads them), and so do ``data``, the fingerprint of the data trained
    on (train/data/fingerprint.py: a resume compares it), and ``data_switched``, what data the run left
    on purpose at which step (--switch-data); ``universal_info`` goes into DeepSpeed's client state,
    for converting the checkpoint to another layout (reshard.py)."""
    tag = tag_for(step)
    client_state: dict[str, object] = {"step": step}
    if universal_info is not None:
        client_state["universal_checkpoint_info"] = universal_info
    # save_latest=False: DeepSpeed's `latest` file would name a checkpoint before its manifest
    # exists; resume picks the newest intact directory itself.
    try:
        engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state=client_state, save_latest=False)
    except Exception as e:
        # torch.save reports a full disk as "basic_ios::clear: iostream error": say what it is.
        free = shutil.disk_usage(ckpt_dir).free if ckpt_dir.exists() else None
        full = free is not None and free < (1 << 20)
        raise RuntimeError(
            f"dsorch train: saving checkpoint {tag} in {ckpt_dir} failed ({' '.join(str(e).split())[:200]})"
            + (f"; the disk is full ({free:,} bytes free)" if full else "")
            + ". It has no manifest, so a rerun skips it and resumes from the newest intact checkpoint."
        ) from e
    dist.barrier()  # every rank's files are on disk before rank 0 hashes them
    if is_rank0:
        tag_dir = ckpt_dir / tag
        tmp = tag_dir / (MANIFEST + ".tmp")
        doc = {"step": step, "files": file_digests(tag_dir)}
        if layout is not None:
            doc.update(layout=layout, plan=plan)
        if data is not None:
            doc["data"] = data
        if data_switched is not None:
            doc["data_switched"] = data_switched
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, tag_dir / MANIFEST)
        for old in sorted(p for p in ckpt_dir.glob("step*") if p.is_dir())[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def manifest_of(tag_dir: Path) -> dict:
    return json.loads((tag_dir / MANIFEST).read_text(encoding="utf-8"))


def newest_intact(ckpt_dir: Path, prefix: str = "step") -> Path | None:
    """The newest checkpoint directory named ``prefix...`` whose files match its manifest."""
    if not ckpt_dir.is_dir():
        return None
    for tag_dir in sorted(
        (p for p in ckpt_dir.glob(f"{prefix}*") if p.is_dir() and not p.name.endswith(".tmp")), reverse=True
    ):
        why = damage(tag_dir)
        if why is None:
            return tag_dir
        warnings.warn(f"checkpoint {tag_dir} is damaged: {why}; falling back to the previous checkpoint", stacklevel=2)
    return None


def _choose(ckpt_dir: Path, layout: dict, naming: str) -> tuple[str | None, bool, str | None]:
    """(tag, universal, error): the newest intact native checkpoint of this layout, or the
    universal conversion (`dsorch replan`) of a newer one; an error when the newest checkpoint is
    of another layout with no conversion to load instead."""
    native = newest_intact(ckpt_dir)
    universal = newest_intact(ckpt_dir, UNIVERSAL_PREFIX)
    n_man = manifest_of(native) if native else None
    u_man = manifest_of(universal) if universal else None
    n_step = n_man["step"] if n_man else -1
    # A manifest without a layout is from before dsorch recorded it: taken as this layout's.
    own = n_man is not None and n_man.get("layout") in (None, layout)
    # A manifest is None exactly when its directory is: the conditions below name both so that a
    # type checker knows the directory is there.
    if universal and u_man is not None and (u_man["step"] > n_step or (u_man["step"] == n_step and not own)):
        if u_man.get("naming") != naming:
            return (
                None,
                False,
                (
                    f"{universal} was converted for a {u_man.get('naming')} model, this plan runs a "
                    f"{naming} one; convert again with `dsorch replan` for this plan"
                ),
            )
        return universal.name, True, None
    if not native or n_man is None:
        return None, False, None
    if not own:
        return (
            None,
            False,
            (
                f"the newest checkpoint, {native}, was written by another layout ({n_man['layout']}); "
                f"this plan's layout cannot load it as it is. Convert it with `dsorch replan RUN_DIR` "
                f"(DeepSpeed's universal checkpoint), or resume with the plan that wrote it"
            ),
        )
    return native.name, False, None


def choose_resume(ckpt_dir: Path, is_rank0: bool, layout: dict, naming: str) -> tuple[str | None, bool]:
    """The checkpoint to resume from, decided on rank 0 and broadcast to all: (tag, universal)."""
    choice: list[object] = [None, False, None]  # what _choose returns, as broadcast_object_list fills it
    if is_rank0:
        choice = list(_choose(ckpt_dir, layout, naming))
    dist.broadcast_object_list(choice, src=0)
    tag, universal, error = choice
    if error:
        raise ValueError(error)
    return None if tag is None else str(tag), bool(universal)


def load(engine, ckpt_dir: Path, tag: str) -> int:
    """Load model, optimizer and scheduler state; returns the number of steps already done."""
    path, client_state = engine.load_checkpoint(str(ckpt_dir), tag=tag)
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {ckpt_dir / tag}")
    return int(client_state["step"])
