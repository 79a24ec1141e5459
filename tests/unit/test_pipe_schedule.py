"""dsorch's model of DeepSpeed's pipeline schedule (costmodel/pipe_schedule.py): the instruction
stream is DeepSpeed's own TrainSchedule's, the simulation with blocking point-to-point gives the
closed form the vectorized cost model uses, and the deepspeed runtime's pipeline terms in
evaluate() are that closed form."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from deepspeed.runtime.pipe.schedule import TrainSchedule

from orchestrator.costmodel import pipe_schedule as ps


@pytest.mark.parametrize("stages", [2, 3, 4, 5, 8])
def test_stream_is_deepspeeds_train_schedule(stages):
    """Name and buffer of every instruction (DeepSpeed cycles its buffers: micro-batch mod their
    number) as DeepSpeed's own TrainSchedule yields them."""
    for m, s in itertools.product([1, 2, 3, 4, 7, 12], range(stages)):
        sched = TrainSchedule(micro_batches=m, stages=stages, stage_id=s)
        n = sched.num_pipe_buffers()
        theirs = [(type(c).__name__, c.kwargs.get("buffer_id")) for cmds in sched.steps() for c in cmds]
        mine = [(i.name, None if i.micro_batch < 0 else i.micro_batch % n) for i in ps.stream(s, stages, m)]
        assert mine == theirs, (stages, m, s)


def _grid():
    rng = np.random.default_rng(25)
    for p, m in itertools.product(range(2, 10), [1, 2, 3, 5, 8, 17, 40]):
        forward, backward = rng.uniform(0.2, 2.0), rng.uniform(0.2, 4.0)
        p2p = rng.uniform(0.0, 0.5) * min(forward, backward)
        tied, reduce, opt, finish = rng.uniform(0.0, 1.0, 4)
        yield p, m, forward, backward, p2p, tied, reduce, opt, finish


def test_closed_form_equals_the_simulation_of_equal_stages():
    for p, m, f, b, c, tied, reduce, opt, finish in _grid():
        d = ps.Durations(forward=f, backward=b, p2p=c, tied=[tied if s in (0, p - 1) else 0.0 for s in range(p)],
                         reduce=reduce, optimizer=opt, finish=finish)
        simulated = ps.simulate(p, m, d).step
        closed = float(ps.closed_form(p, m, f, b, c, tied, reduce, opt, finish))
        assert closed == pytest.approx(simulated, rel=1e-12, abs=1e-12), (p, m, f, b, c)


def test_blocking_transfers_are_on_the_critical_path():
    """Each transfer costs the batch what exposed_transfers says: more than the 2 (m + p - 1) of a
    schedule that sends once each way per micro-batch and step from three stages on."""
    for p, m in itertools.product(range(3, 9), [2, 4, 16]):
        free = ps.simulate(p, m, ps.Durations(forward=1.0, backward=2.0)).step
        slow = ps.simulate(p, m, ps.Durations(forward=1.0, backward=2.0, p2p=0.01)).step
        assert (slow - free) / 0.01 == pytest.approx(float(ps.exposed_transfers(p, m)))
        assert float(ps.exposed_transfers(p, m)) > 2 * (m + p - 1) or m < 3


def test_unequal_stages_are_bounded_by_the_slowest():
    """The cost model takes the slowest stage's pass times for every stage: an upper bound."""
    rng = np.random.default_rng(7)
    for p, m in itertools.product(range(2, 8), [1, 3, 8]):
        f, b = rng.uniform(0.5, 2.0, p), rng.uniform(0.5, 4.0, p)
        sim = ps.simulate(p, m, ps.Durations(forward=f, backward=b, p2p=0.05)).step
        assert sim <= float(ps.closed_form(p, m, float(np.max(f + b)), 0.0, 0.05)) + 1e-12
        assert sim >= (m + p - 1) * float(np.min(f + b))


def test_a_receive_never_posted_deadlocks():
    p, m = 3, 2
    streams = [ps.stream(s, p, m) for s in range(p)]
    streams[1] = [ins for ins in streams[1] if ins.name != ps.RECV_ACT or ins.micro_batch != 0]
    with pytest.raises(RuntimeError, match="deadlocks"):
        ps.simulate(p, m, ps.Durations(forward=1.0, backward=2.0), streams)


def test_partition_gathers_per_stage():
    """Middle stages gather three times per micro-batch, two stages two and one."""
    assert ps.partition_gathers(np.array([1, 2, 3, 8])).tolist() == [0.0, 2.0, 3.0, 3.0]
