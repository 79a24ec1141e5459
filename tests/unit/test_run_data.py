"""The data a run trains on, kept by run/: a requeued job trains on its `--data` again, and the job
registry keeps `dsorch submit --data` for --resume (its schema upgraded from files written before).
The data's fingerprint is test_fingerprint.py's."""

from __future__ import annotations

import sqlite3


def test_a_requeued_job_trains_on_its_data_again():
    from orchestrator.run.jobs import TrainingJob

    job = TrainingJob("/p", "/r", 10, "/d/corpus", switch_data=True)
    cmd = job.command()
    assert cmd[cmd.index("--data") + 1] == "/d/corpus" and "--switch-data" in cmd
    again = job.checkpoint().function  # submitit's DelayedSubmission of the requeue
    assert again.data == "/d/corpus" and again.command() == cmd
    assert "--data" not in TrainingJob("/p", "/r").command()


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
