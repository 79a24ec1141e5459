"""The jobs dsorch submits (orchestrator/run/jobs.py): the command a TrainingJob runs, and the job
submitit requeues from its checkpoint."""

from __future__ import annotations


def test_a_requeued_job_trains_on_its_data_again():
    from orchestrator.run.jobs import TrainingJob

    job = TrainingJob("/p", "/r", 10, "/d/corpus", switch_data=True)
    cmd = job.command()
    assert cmd[cmd.index("--data") + 1] == "/d/corpus" and "--switch-data" in cmd
    again = job.checkpoint().function  # submitit's DelayedSubmission of the requeue
    assert again.data == "/d/corpus" and again.command() == cmd
    assert "--data" not in TrainingJob("/p", "/r").command()
