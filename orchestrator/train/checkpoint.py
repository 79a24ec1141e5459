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

MANIFEST = "dsorch_manifest.json"


def tag_for(step: int) -> str:
    return f"step{step:08d}"


def _files(tag_dir: Path) -> dict[str, dict]:
    out = {}
    for p in sorted(tag_dir.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            with p.open("rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
            out[str(p.relative_to(tag_dir))] = {"bytes": p.stat().st_size, "sha256": digest}
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
    actual = _files(tag_dir)
    for name, rec in expected.items():
        if name not in actual:
            return f"{name} is missing"
        if actual[name] != rec:
            return f"{name} differs from the manifest (size or sha256)"
    return None


def save(engine, ckpt_dir: Path, step: int, keep: int, is_rank0: bool) -> None:
    tag = tag_for(step)
    # save_latest=False: DeepSpeed's `latest` file would name a checkpoint before its manifest
    # exists; resume picks the newest intact directory itself.
    try:
        engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state={"step": step}, save_latest=False)
    except Exception as e:
        # torch.save reports a full disk as "basic_ios::clear: iostream error": say what it is.
        free = shutil.disk_usage(ckpt_dir).free if ckpt_dir.exists() else None
        full = free is not None and free < (1 << 20)
        raise RuntimeError(
            f"dsorch train: saving checkpoint {tag} in {ckpt_dir} failed ({' '.join(str(e).split())[:200]})"
            + (f"; the disk is full ({free:,} bytes free)" if full else "")
            + ". It has no manifest, so a rerun skips it and resumes from the newest intact checkpoint.") from e
    dist.barrier()  # every rank's files are on disk before rank 0 hashes them
    if is_rank0:
        tag_dir = ckpt_dir / tag
        tmp = tag_dir / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps({"step": step, "files": _files(tag_dir)}, indent=1,
                                  sort_keys=True), encoding="utf-8")
        os.replace(tmp, tag_dir / MANIFEST)
        for old in sorted(p for p in ckpt_dir.glob("step*") if p.is_dir())[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def choose_resume_tag(ckpt_dir: Path, is_rank0: bool) -> str | None:
    """Newest intact checkpoint (decided on rank 0, broadcast to all), or None."""
    choice = [None]
    if is_rank0 and ckpt_dir.is_dir():
        for tag_dir in sorted((p for p in ckpt_dir.glob("step*") if p.is_dir()), reverse=True):
            why = damage(tag_dir)
            if why is None:
                choice[0] = tag_dir.name
                break
            warnings.warn(f"checkpoint {tag_dir} is damaged: {why}; falling back to the "
                          "previous checkpoint", stacklevel=2)
    dist.broadcast_object_list(choice, src=0)
    return choice[0]


def load(engine, ckpt_dir: Path, tag: str) -> int:
    """Load model, optimizer and scheduler state; returns the number of steps already done."""
    path, client_state = engine.load_checkpoint(str(ckpt_dir), tag=tag)
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {ckpt_dir / tag}")
    return int(client_state["step"])
