"""The simulated pipeline schedule (orchestrator/cli/plot_schedule.py): it obeys the 1F1B rules and its
bubble is the paper's."""

from __future__ import annotations

import itertools

import pytest

from orchestrator.cli.plot_schedule import schedule


@pytest.mark.parametrize("pp, v, k", [(p, v, k) for p, v, k in itertools.product([2, 3, 4, 8], [1, 2, 4], [1, 2, 3])])
def test_schedule_bubble_is_the_papers(pp, v, k):
    """Without send time, the simulated 1F1B / interleaved schedule takes (m v + pp - 1) chunk
    passes: the bubble fraction (pp - 1) / (m v) of Narayanan et al. 2021, eq. (1) and sec. 2.2.2."""
    m = pp * k
    blocks = schedule(pp, m, v, 1.0, 2.0, 0.0)
    end = max(b.end for b in blocks)
    assert end == pytest.approx((m * v + pp - 1) * 3.0)
    # Each stage runs the forward and the backward of every (micro-batch, chunk) exactly once.
    for s in range(pp):
        mine = sorted((b.kind, b.micro_batch, b.chunk) for b in blocks if b.stage == s)
        assert mine == sorted(itertools.product("BF", range(m), range(v)))


def test_schedule_respects_every_dependency_and_the_send_time():
    pp, m, v, send = 4, 8, 2, 0.25
    blocks = schedule(pp, m, v, 1.0, 2.0, send)
    at = {(b.kind, b.stage, b.micro_batch, b.chunk): b for b in blocks}
    for b in blocks:
        if b.kind == "F" and (b.stage > 0 or b.chunk > 0):
            dep = at[("F", b.stage - 1, b.micro_batch, b.chunk)] if b.stage else at[("F", pp - 1, b.micro_batch, b.chunk - 1)]
            assert b.start >= dep.end + send - 1e-12
        if b.kind == "B":
            assert b.start >= at[("F", b.stage, b.micro_batch, b.chunk)].end
            if b.stage < pp - 1:
                assert b.start >= at[("B", b.stage + 1, b.micro_batch, b.chunk)].end + send - 1e-12
    for s in range(pp):  # one pass at a time per stage
        mine = sorted((b.start, b.end) for b in blocks if b.stage == s)
        assert all(x[1] <= y[0] + 1e-12 for x, y in zip(mine, mine[1:]))
