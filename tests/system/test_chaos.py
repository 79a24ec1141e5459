"""The soak under faults (scripts/bench_chaos.py) in the test suite, short: a tiny model on 2 CPU
ranks across the loopback cluster's 2 nodes is preempted (SIGTERM, then SLURM's requeue), has a
rank SIGKILLed and meets a full disk, in an order and at steps the seed draws; it ends COMPLETED
with every step once, the losses of the same plan run without faults, and no half-written
checkpoint. All six kinds of fault: `python scripts/bench_chaos.py` (`--long` for thousands of steps)."""

from __future__ import annotations

import os

import pytest

from ..conftest import load_script
from .test_slurm import slurm_env  # noqa: F401 (the fixture, shared)

pytestmark = pytest.mark.slurm

chaos = load_script("bench_chaos")


# Three faults keep the test near 2 minutes on a busy machine (each costs the run a restart): the
# kinds no other test of the suite brings to a SLURM job. Requeue and SIGUSR2 are in
# test_slurm.py's requeue tests, a drained node in its lost-node test; the soak has them all.
CI_KINDS = ("preempt-term", "kill-rank", "disk-full")


@pytest.mark.skipif(os.geteuid() != 0, reason="the disk-full fault mounts a tmpfs, which needs root")
def test_a_run_survives_a_sigterm_preemption_a_killed_rank_and_a_full_disk(slurm_env):  # noqa: F811
    # Steps paced at 0.25 s (the entrypoint's test hook): a fast machine would otherwise train past the
    # step a fault was drawn for between two polls, and a fault could land after the last step.
    env = dict(slurm_env, DSORCH_TEST_MIN_STEP_SECONDS="0.25")
    report = chaos.run_soak(env, steps=100, faults=len(CI_KINDS), seed=1, save_interval=10, kinds=CI_KINDS)
    print(report.summary())
    assert report.problems == [], report.summary()
    assert report.survived == {kind: 1 for kind in CI_KINDS}, report.summary()
    assert report.resubmits == 2  # the killed rank and the full disk failed their jobs; --resume went on
    assert report.starts >= len(CI_KINDS) + 1  # every fault cost the run a start
