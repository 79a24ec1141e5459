"""The job registry of an experiment directory: ``.dsorch/jobs.sqlite``.

One row per submission: the scheduler's job id, the plan directory and a hash of its files, the
cluster, submit time, last known state, run directory, requeue count and last step/loss. SQLite
in WAL mode with a busy timeout survives crashes (every change is one transaction) and several
``dsorch`` processes at once (writers queue on the database lock; ``submit`` checks for a running
job of the same plan and inserts its row in one ``BEGIN IMMEDIATE`` transaction, so two
concurrent submits cannot both pass the check).

Schema (``PRAGMA user_version`` = 3; an older file gains the ``data`` (2) and ``login`` (3) columns
on first use)::

    jobs(key INTEGER PRIMARY KEY AUTOINCREMENT,  -- dsorch's own id, stable across requeues
         job_id TEXT,        -- SLURM job id (on the login node for 'remote'), or the local controller's pid
         executor TEXT,      -- spec/cluster.py EXECUTORS: 'slurm' | 'local' | 'remote' (over SSH),
                             -- the backend that watches and cancels it (run/backends/)
         cluster TEXT, plan_dir TEXT, plan_sha256 TEXT, submitted_at TEXT (UTC ISO 8601),
         state TEXT,         -- SLURM's state names: PENDING RUNNING COMPLETED FAILED CANCELLED ...
         run_dir TEXT, log_dir TEXT, requeues INTEGER, last_step INTEGER, last_loss REAL,
         elapsed_s REAL, error TEXT, updated_at TEXT,
         data TEXT)          -- `dsorch submit --data`: what --resume and requeues train on again;
                             -- NULL: the plan's training.data
         login TEXT)         -- 'remote' jobs: the profile's login section as JSON at submit time
                             -- (host, port, identity_file, remote_dir, known_hosts, dsorch)
"""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.errors import DsorchError, JobError
from orchestrator.spec.cluster import Executor

SCHEMA_VERSION = 3
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "REQUEUED",
        "CONFIGURING",
        "COMPLETING",
        "SUSPENDED",
        "RESIZING",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "SUBMITTED",
    }
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    key INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    executor TEXT NOT NULL,
    cluster TEXT NOT NULL,
    plan_dir TEXT NOT NULL,
    plan_sha256 TEXT NOT NULL,
    submitted_at TEXT NOT NULL,
    state TEXT NOT NULL,
    run_dir TEXT NOT NULL,
    log_dir TEXT NOT NULL,
    requeues INTEGER NOT NULL DEFAULT 0,
    last_step INTEGER,
    last_loss REAL,
    elapsed_s REAL,
    error TEXT,
    updated_at TEXT NOT NULL,
    data TEXT,
    login TEXT
);
CREATE INDEX IF NOT EXISTS jobs_plan ON jobs (plan_dir);
CREATE INDEX IF NOT EXISTS jobs_job_id ON jobs (job_id);
"""


@dataclass(frozen=True)
class JobRecord:
    key: int
    job_id: str
    executor: Executor  # as stored: run/backends backend_for refuses a value it does not know
    cluster: str
    plan_dir: str
    plan_sha256: str
    submitted_at: str
    state: str
    run_dir: str
    log_dir: str
    requeues: int
    last_step: int | None
    last_loss: float | None
    elapsed_s: float | None
    error: str | None
    updated_at: str
    data: str | None = None  # `dsorch submit --data`, absolute; None: the plan's training.data
    login: str | None = None  # executor 'remote': the profile's login section (JSON) it went through

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


_COLUMNS = [f.name for f in fields(JobRecord)]


def now_utc() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


class RegistryDamaged(DsorchError):
    """jobs.sqlite cannot be read as a registry; `dsorch status --repair` mends it."""


class Registry:
    def __init__(self, experiment_dir: Path) -> None:
        self.dir = Path(experiment_dir) / ".dsorch"
        self.path = self.dir / "jobs.sqlite"

    def _damaged(self, e: Exception) -> RegistryDamaged:
        return RegistryDamaged(
            f"{self.path}: the job registry is damaged ({' '.join(str(e).split())[:200]}). Run "
            f"`dsorch status --repair`: it keeps the damaged file as {self.path.name}.damaged-<time> "
            f"and copies every row it can still read into a new registry."
        )

    def _check_dir(self) -> None:
        if self.dir.exists() and not self.dir.is_dir():
            raise JobError(
                f"{self.dir} is a file; dsorch keeps its job registry in the directory {self.dir.name}/ "
                f"of the experiment directory: move the file away."
            )

    @contextlib.contextmanager
    def _connect(self, write: bool = False):
        self._check_dir()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            con = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            # A flipped bit in a text column must not become a UnicodeDecodeError far from here.
            con.text_factory = _text
        except (OSError, sqlite3.Error) as e:
            raise JobError(
                f"{self.path}: cannot open the job registry ({e}); run dsorch from a directory you can write to."
            ) from e
        try:
            with self._translated():
                yield from self._session(con, write)
        finally:
            con.close()

    @contextlib.contextmanager
    def _translated(self):
        """sqlite's errors as one paragraph each: a lock held too long, or a damaged file."""
        try:
            yield
        except sqlite3.OperationalError as e:
            if "locked" in str(e) or "busy" in str(e):
                raise JobError(
                    f"{self.path}: another dsorch process held the registry for over a minute "
                    f"({e}); wait for it to finish and try again."
                ) from None
            raise self._damaged(e) from None
        except (sqlite3.DatabaseError, UnicodeDecodeError) as e:  # e.g. a flipped bit in a stored name
            raise self._damaged(e) from None

    def _session(self, con, write: bool):
        """Set up a connection (schema on first use) and hold one transaction for writers."""
        con.execute("PRAGMA busy_timeout = 60000")
        con.execute("PRAGMA journal_mode = WAL")
        version = con.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            con.execute("BEGIN IMMEDIATE")
            if con.execute("PRAGMA user_version").fetchone()[0] == 0:
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    con.execute(statement)
                con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            con.execute("COMMIT")
        elif version < SCHEMA_VERSION:
            _migrate(con)
        elif version > SCHEMA_VERSION:
            raise JobError(f"{self.path} was written by a newer dsorch (schema {version}); upgrade dsorch.")
        if write:
            con.execute("BEGIN IMMEDIATE")
        try:
            yield con
            if write:
                con.execute("COMMIT")
        except BaseException:
            if write:
                with contextlib.suppress(sqlite3.Error):  # a damaged file may refuse even this
                    con.execute("ROLLBACK")
            raise

    @staticmethod
    def _record(row) -> JobRecord:
        return JobRecord(**dict(zip(_COLUMNS, row, strict=True)))  # every query selects _COLUMNS

    def all(self) -> list[JobRecord]:
        self._check_dir()
        if not self.path.exists():
            return []
        with self._connect() as con:
            rows = con.execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs ORDER BY key").fetchall()
        return [self._record(r) for r in rows]

    def get(self, ref: str) -> JobRecord:
        """A job by dsorch key ('3'), or by scheduler job id."""
        with self._connect() as con:
            row = con.execute(
                f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE job_id = ? ORDER BY key DESC LIMIT 1", (ref,)
            ).fetchone()
            if row is None and ref.isdigit():
                row = con.execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE key = ?", (int(ref),)).fetchone()
        if row is None:
            known = ", ".join(f"{r.job_id}" for r in self.all()[-10:]) or "none yet"
            raise JobError(
                f"no job '{ref}' in {self.path}; known job ids: {known}. Run `dsorch status` from the "
                f"experiment directory you submitted from."
            )
        return self._record(row)

    @contextlib.contextmanager
    def reserve(self, plan_dir: str | list[str], force: bool):
        """Check that no job of ``plan_dir`` (or of any of a list) is active and hold the write lock
        while submitting.

        Yields ``(insert, update)``: ``insert(**fields) -> key`` adds the row, ``update(key,
        **fields)`` completes it once the scheduler accepted the job. The check, the row and its
        job id are one transaction: a crash or a refused submission leaves no row behind.
        Scheduler job ids are not unique over time (local ids are PIDs, SLURM restarts its
        counter), so rows are keyed by dsorch's own ``key`` and a job id names its newest row.
        """
        plans = [plan_dir] if isinstance(plan_dir, str) else list(plan_dir)
        with self._connect(write=True) as con:
            for plan in plans:
                active = con.execute(
                    f"SELECT job_id, state FROM jobs WHERE plan_dir = ? AND state IN "
                    f"({','.join('?' * len(ACTIVE_STATES))})",
                    (plan, *sorted(ACTIVE_STATES)),
                ).fetchall()
                if active and not force:
                    jobs = ", ".join(f"{j} ({s})" for j, s in active)
                    raise JobError(
                        f"plan {plan} already has a job pending or running: {jobs}. Wait for it, "
                        f"`dsorch cancel` it, or pass --force to submit another."
                    )

            def insert(**values) -> int:
                values.setdefault("updated_at", now_utc())
                cols = ", ".join(values)
                cur = con.execute(
                    f"INSERT INTO jobs ({cols}) VALUES ({', '.join('?' * len(values))})", tuple(values.values())
                )
                return int(cur.lastrowid)

            yield insert, lambda key, **values: _update(con, key, values)

    def repair(self) -> tuple[int, int, Path | None]:
        """Keep a damaged registry aside and start a new one with every row that can still be read.
        Returns (rows kept, rows lost, where the old file went); (n, 0, None) when it was intact."""
        import shutil
        import time

        try:
            return len(self.all()), 0, None
        except RegistryDamaged:
            pass
        rows, lost = _salvage(self.path)
        backup = self.path.with_name(f"{self.path.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
        for suffix in ("", "-wal", "-shm"):
            old = Path(str(self.path) + suffix)
            if old.exists():
                shutil.move(old, Path(str(backup) + suffix))
        with self._connect(write=True) as con:
            for row in rows:
                con.execute(f"INSERT INTO jobs ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})", row)
        return len(rows), lost, backup

    def update(self, key: int, **values) -> None:
        with self._connect(write=True) as con:
            _update(con, key, values)


# The columns each schema version added, in order: an older file gains them on first use.
_ADDED = {
    # NULL for the jobs before it: they trained on what their --data said, which schema 1 did not keep.
    2: "ALTER TABLE jobs ADD COLUMN data TEXT",
    # NULL for every job before it: none went over SSH.
    3: "ALTER TABLE jobs ADD COLUMN login TEXT",
}


def _migrate(con: sqlite3.Connection) -> None:
    """An older schema brought to SCHEMA_VERSION, one version at a time, in one transaction."""
    con.execute("BEGIN IMMEDIATE")
    version = con.execute("PRAGMA user_version").fetchone()[0]  # another process may have done it
    for step in range(version + 1, SCHEMA_VERSION + 1):
        con.execute(_ADDED[step])
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    con.execute("COMMIT")


def _update(con: sqlite3.Connection, key: int, values: dict) -> None:
    values = {**values, "updated_at": now_utc()}
    sets = ", ".join(f"{k} = ?" for k in values)
    con.execute(f"UPDATE jobs SET {sets} WHERE key = ?", (*values.values(), key))


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _salvage(path: Path) -> tuple[list[tuple], int]:
    """The rows of a damaged registry that still read back whole, and how many did not. Rows are
    read one key at a time, so one bad page costs only the rows on it."""
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
        con.text_factory = _text
    except sqlite3.Error:
        return [], 0
    rows: list[tuple] = []
    lost = 0
    try:
        try:
            top = con.execute("SELECT MAX(key) FROM jobs").fetchone()[0] or 0
        except (sqlite3.Error, UnicodeDecodeError, TypeError, ValueError):
            return [], 0  # no table, or not a database at all: nothing to salvage
        # An older file lacks the later columns (``data``, ``login``): NULL in their place.
        try:
            present = {r[1] for r in con.execute("PRAGMA table_info(jobs)")}
        except (sqlite3.Error, UnicodeDecodeError):
            present = set(_COLUMNS)
        select = ", ".join(c if c in present else "NULL" for c in _COLUMNS)
        for key in range(1, int(top) + 1):
            try:
                row = con.execute(f"SELECT {select} FROM jobs WHERE key = ?", (key,)).fetchone()
            except (sqlite3.Error, UnicodeDecodeError):
                lost += 1
                continue
            if row is not None:
                rows.append(row)
    finally:
        con.close()
    return rows, lost
