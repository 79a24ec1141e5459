"""The job registry under concurrent submits from separate processes."""

from __future__ import annotations

import multiprocessing as mp

from orchestrator.errors import DsorchError
from orchestrator.run.registry import Registry

from ..unit.test_registry import _fields

def _racer(args):
    path, i = args
    reg = Registry(path)
    try:
        with reg.reserve("plans/same", force=False) as (insert, _):
            insert(**_fields(f"job{i}", plan="plans/same"))
        return "accepted"
    except DsorchError:
        return "refused"


def test_concurrent_submits_of_one_plan_accept_exactly_one(tmp_path):
    with mp.get_context("spawn").Pool(10) as pool:
        results = pool.map(_racer, [(tmp_path, i) for i in range(10)])
    assert results.count("accepted") == 1 and results.count("refused") == 9
    assert len(Registry(tmp_path).all()) == 1
