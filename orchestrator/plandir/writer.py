"""The one place that writes a plan directory, and the diff behind ``dsorch plan --check``.

Writes are all-or-nothing: a new directory is filled under a temporary name and renamed into
place; an existing one (which may hold the user's run directories) gets each file written to a
temporary name first and renamed over the old one only once every file has been written.
"""

from __future__ import annotations

import difflib
import os
import shutil
import tempfile
from pathlib import Path

from orchestrator.errors import OutputError
from orchestrator.plandir.reader import GENERATED

EXECUTABLE = ("launch.sh", "job.sbatch")


def spec_path_in(p: Path, out: Path | None) -> str:
    """The spec path as written into generated files: relative to the plan directory when there is
    one (so the files do not depend on where dsorch ran from), never absolute."""
    if out is not None:
        return Path(os.path.relpath(os.path.abspath(p), os.path.abspath(out))).as_posix()
    if not p.is_absolute():
        return p.as_posix()
    try:
        return p.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return p.name


def _mode(name: str) -> int:
    return 0o755 if name in EXECUTABLE else 0o644


def _write_temp(directory: Path, name: str, text: str) -> Path:
    """``text`` in a new temporary file beside its destination ``directory/name``, with the
    destination's mode; the caller renames it into place."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, _mode(name))
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def write_plan_dir(out: Path, files: dict[str, str]) -> None:
    out = Path(out)
    parent = out.parent if str(out.parent) else Path(".")
    created = _missing_ancestors(parent)
    try:
        _write_plan_dir(out, parent, files)
    except BaseException:
        # Nothing half-written: the directories this call created for --out go too (deepest first,
        # only while empty).
        for d in created:
            try:
                d.rmdir()
            except OSError:
                break
        raise


def _missing_ancestors(p: Path) -> list[Path]:
    """``p`` and its parents that do not exist yet, deepest first."""
    missing = []
    for d in (p, *p.parents):
        if d.exists():
            break
        missing.append(d)
    return missing


def _write_plan_dir(out: Path, parent: Path, files: dict[str, str]) -> None:
    try:
        parent.mkdir(parents=True, exist_ok=True)
        if out.exists() and not out.is_dir():
            raise OutputError(f"--out {out}: exists and is not a directory; choose a directory path.")
        if not out.exists():
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=parent))
            try:
                for name, text in files.items():
                    os.replace(_write_temp(tmp, name, text), tmp / name)
                os.chmod(tmp, 0o755)
                os.rename(tmp, out)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            return
        # Every destination must be replaceable before the first rename, so that a plan
        # directory is never left half old, half new.
        if not os.access(out, os.W_OK | os.X_OK):
            raise OutputError(
                f"--out {out}: the directory is not writable; fix its permissions or choose another. "
                f"Nothing was written."
            )
        for name in [*files, *GENERATED]:
            dest = out / name
            if dest.is_dir():
                raise OutputError(
                    f"--out {out}: {dest} is a directory where dsorch writes a file; remove it and "
                    f"rerun. Nothing was written."
                )
        staged: list[tuple[Path, Path]] = []
        try:
            for name, text in files.items():
                staged.append((_write_temp(out, name, text), out / name))
            for tmp_path, final in staged:
                os.replace(tmp_path, final)
        finally:
            for tmp_path, _ in staged:
                tmp_path.unlink(missing_ok=True)
        for name in GENERATED:
            if name not in files:
                (out / name).unlink(missing_ok=True)
    except OutputError:
        raise
    except OSError as e:
        raise OutputError(
            f"--out {out}: cannot write the plan directory ({e.strerror or e}); choose a directory you "
            f"can write to, or fix its permissions."
        ) from e


def diff_plan_dir(out: Path, files: dict[str, str]) -> str:
    """A unified diff from the files on disk to ``files`` (empty when identical). ``files`` may name
    files below ``out`` (``plots/memory.svg``); a picture that differs gets one line, not a diff."""
    out = Path(out)
    chunks: list[str] = []
    for name in sorted(set(files) | {n for n in GENERATED if (out / n).exists()}):
        path = out / name
        try:
            old = path.read_text(encoding="utf-8") if path.exists() else ""
        except (OSError, UnicodeDecodeError) as e:
            old = f"<unreadable: {e}>\n"
        new = files.get(name, "")
        if old != new and name.endswith(".svg"):
            # An SVG's diff is lines of path data that no reviewer reads; which picture is enough.
            state = "differs from" if path.exists() else "is missing from"
            chunks.append(f"{path} {state} the picture of the regenerated plan\n")
        elif old != new:
            chunks.extend(
                difflib.unified_diff(
                    old.splitlines(keepends=True),
                    new.splitlines(keepends=True),
                    fromfile=f"{path} (on disk)",
                    tofile=f"{path} (regenerated)",
                )
            )
    return "".join(chunks)


def write_text_atomic(path: Path, text: str) -> None:
    """Write one file all-or-nothing (temporary file in the same directory, then rename)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(_write_temp(path.parent, path.name, text), path)
    except OSError as e:
        raise OutputError(f"{path}: cannot write ({e.strerror or e}); choose a path you can write to.") from e
