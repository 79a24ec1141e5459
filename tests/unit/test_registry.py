"""The job registry (orchestrator/run/registry.py): one transaction per change, consistent under
concurrent dsorch processes; files of an earlier schema read, upgraded and salvaged."""

from __future__ import annotations

import sqlite3

import pytest

from orchestrator.errors import DsorchError
from orchestrator.run.registry import SCHEMA_VERSION, Registry


def _fields(job_id, plan="plans/a", state="PENDING"):
    return dict(job_id=job_id, executor="slurm", cluster="c", plan_dir=plan, plan_sha256="x" * 64,
                submitted_at="2026-01-01T00:00:00+00:00", state=state, run_dir="runs/r", log_dir="logs")


def test_insert_get_update(tmp_path):
    reg = Registry(tmp_path)
    with reg.reserve("plans/a", force=False) as (insert, _):
        key = insert(**_fields("101"))
    rec = reg.get("101")
    assert rec.key == key and rec.state == "PENDING" and rec.active
    assert reg.get(str(key)).job_id == "101"
    reg.update(key, state="COMPLETED", last_step=5, last_loss=1.5)
    rec = reg.get("101")
    assert (rec.state, rec.last_step, rec.last_loss, rec.active) == ("COMPLETED", 5, 1.5, False)
    assert sqlite3.connect(reg.path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_refuses_second_active_job_of_a_plan_unless_forced(tmp_path):
    reg = Registry(tmp_path)
    with reg.reserve("plans/a", force=False) as (insert, _):
        insert(**_fields("1"))
    with pytest.raises(DsorchError, match=r"plan plans/a already has a job pending or running: 1 \(PENDING\)"):
        with reg.reserve("plans/a", force=False) as (insert, _):
            insert(**_fields("2"))
    with reg.reserve("plans/a", force=True) as (insert, _):
        insert(**_fields("2"))
    with reg.reserve("plans/b", force=False) as (insert, _):  # another plan is fine
        insert(**_fields("3", plan="plans/b"))
    assert [r.job_id for r in reg.all()] == ["1", "2", "3"]


def test_failed_submission_leaves_no_row(tmp_path):
    reg = Registry(tmp_path)
    with pytest.raises(RuntimeError):
        with reg.reserve("plans/a", force=False) as (insert, _):
            insert(**_fields("1"))
            raise RuntimeError("sbatch refused")
    assert reg.all() == []


def test_unknown_job_names_known_ones(tmp_path):
    reg = Registry(tmp_path)
    with reg.reserve("plans/a", force=False) as (insert, _):
        insert(**_fields("77"))
    with pytest.raises(DsorchError, match="no job '78' .* known job ids: 77"):
        reg.get("78")


def test_job_ids_may_repeat_and_name_their_newest_row(tmp_path):
    """Local job ids are PIDs and SLURM may restart its counter: a repeat is not an error."""
    reg = Registry(tmp_path)
    with reg.reserve("plans/a", force=False) as (insert, update):
        k1 = insert(**_fields("pending"))
        update(k1, job_id="1234", state="COMPLETED")
    with reg.reserve("plans/a", force=False) as (insert, update):
        k2 = insert(**_fields("pending"))
        update(k2, job_id="1234", state="RUNNING")
    assert reg.get("1234").key == k2
    assert [r.state for r in reg.all()] == ["COMPLETED", "RUNNING"]


def _three_jobs(tmp_path) -> Registry:
    reg = Registry(tmp_path)
    for i in range(3):
        with reg.reserve(f"plans/p{i}", force=False) as (insert, _):
            insert(**_fields(str(200 + i), plan=f"plans/p{i}", state="COMPLETED"))
    # Fold the write-ahead log into the file, as a finished dsorch process leaves it.
    con = sqlite3.connect(reg.path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return reg


@pytest.mark.parametrize("damage", ["truncate", "garbage", "no-table", "bitflip-header"])
def test_a_damaged_registry_is_one_paragraph_and_repair_keeps_what_reads(tmp_path, runner, monkeypatch, damage):
    from orchestrator.cli.main import main

    reg = _three_jobs(tmp_path)
    data = reg.path.read_bytes()
    if damage == "truncate":
        reg.path.write_bytes(data[: len(data) // 3])
    elif damage == "garbage":
        reg.path.write_bytes(b"this is not a database" * 100)
    elif damage == "no-table":
        con = sqlite3.connect(reg.path)
        con.execute("DROP TABLE jobs")
        con.close()
    else:
        reg.path.write_bytes(data[:16] + bytes([data[16] ^ 0xFF]) + data[17:])  # the page size field
    monkeypatch.chdir(tmp_path)
    for args in (["status"], ["status", "--json"], ["logs", "200"], ["cancel", "200"]):
        r = runner.invoke(main, args)
        assert r.exit_code == 2, (args, r.output)
        assert "the job registry is damaged" in r.output and "dsorch status --repair" in r.output, r.output
        assert "Traceback" not in r.output
    r = runner.invoke(main, ["status", "--repair"])
    assert r.exit_code == 0, r.output
    assert "repaired" in r.output and list(tmp_path.glob(".dsorch/jobs.sqlite.damaged-*"))
    r = runner.invoke(main, ["status", "--json"])
    assert r.exit_code == 0, r.output
    assert runner.invoke(main, ["status", "--repair"]).output.startswith(f"{reg.path}: intact")


def test_repair_keeps_every_row_of_an_intact_table(tmp_path):
    reg = _three_jobs(tmp_path)
    assert reg.repair() == (3, 0, None)
    assert [r.job_id for r in reg.all()] == ["200", "201", "202"]


def test_registry_edge_cases_are_one_paragraph(tmp_path, runner, monkeypatch):
    from orchestrator.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / ".dsorch").write_text("not a directory")
    r = runner.invoke(main, ["status"])
    assert r.exit_code == 2 and ".dsorch is a file" in r.output and "Traceback" not in r.output
    (tmp_path / ".dsorch").unlink()
    reg = Registry(tmp_path)
    with reg.reserve("plans/x", force=False) as (insert, _):
        insert(**{**_fields("abc", plan="plans/x", state="RUNNING"), "executor": "local"})
    r = runner.invoke(main, ["status", "--json"])
    assert r.exit_code == 0 and "not a local process id" in r.output
    r = runner.invoke(main, ["cancel", "abc"])
    assert r.exit_code == 2 and "nothing to cancel" in r.output and "Traceback" not in r.output


def test_the_registry_keeps_the_data_and_upgrades_a_schema_1_file(tmp_path):
    from orchestrator.run.registry import Registry

    reg = Registry(tmp_path)
    reg.dir.mkdir()
    con = sqlite3.connect(reg.path)  # a registry as dsorch wrote it before the data column
    con.executescript("""
        CREATE TABLE jobs (key INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, executor TEXT NOT NULL,
            cluster TEXT NOT NULL, plan_dir TEXT NOT NULL, plan_sha256 TEXT NOT NULL, submitted_at TEXT NOT NULL,
            state TEXT NOT NULL, run_dir TEXT NOT NULL, log_dir TEXT NOT NULL, requeues INTEGER NOT NULL DEFAULT 0,
            last_step INTEGER, last_loss REAL, elapsed_s REAL, error TEXT, updated_at TEXT NOT NULL);
        INSERT INTO jobs (job_id, executor, cluster, plan_dir, plan_sha256, submitted_at, state, run_dir, log_dir,
            updated_at) VALUES ('9', 'slurm', 'c', 'plans/a', 'x', 't', 'COMPLETED', 'runs/r', 'logs', 't');
        PRAGMA user_version = 1;
    """)
    con.close()
    assert reg.repair() == (1, 0, None)  # reads (and upgrades) the old file: nothing damaged
    assert [(r.job_id, r.data, r.login) for r in reg.all()] == [("9", None, None)]
    assert sqlite3.connect(reg.path).execute("PRAGMA user_version").fetchone()[0] == 3  # 1 -> 2 -> 3
    with reg.reserve("plans/a", force=False) as (insert, _):
        insert(job_id="10", executor="slurm", cluster="c", plan_dir="plans/a", plan_sha256="x", submitted_at="t",
               state="PENDING", run_dir="runs/r", log_dir="logs", data="/d/corpus")
    assert reg.get("10").data == "/d/corpus"


def test_a_damaged_schema_1_registry_is_salvaged(tmp_path):
    from orchestrator.run.registry import _salvage

    path = tmp_path / "jobs.sqlite"
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE jobs (key INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT, executor TEXT, cluster TEXT,
            plan_dir TEXT, plan_sha256 TEXT, submitted_at TEXT, state TEXT, run_dir TEXT, log_dir TEXT,
            requeues INTEGER, last_step INTEGER, last_loss REAL, elapsed_s REAL, error TEXT, updated_at TEXT);
        INSERT INTO jobs (job_id) VALUES ('1');
    """)
    con.close()
    rows, lost = _salvage(path)
    assert lost == 0 and len(rows) == 1 and rows[0][1] == "1" and rows[0][-1] is None
