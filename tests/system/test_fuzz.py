"""The fuzzer (scripts/fuzz.py) in the test suite, on a bounded budget: mutated specs and
profiles, random plan flags and odd --out paths, damaged plan directories and registries, each
through the real `dsorch` command. No traceback, hang, output blow-up, unparseable script,
injection (a canary file that must never appear) or leftover file. Long runs:
`python scripts/fuzz.py --n 10000`."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ..conftest import load_script

fuzz = load_script("fuzz")


def _assert_clean(report) -> None:
    summary = {cls: found[:3] for cls, found in report.problems.items()}
    assert report.ok, f"{sum(map(len, report.problems.values()))} problems in {report.cases} cases: {summary}"


@settings(max_examples=4, deadline=None, derandomize=True)
@given(seed=st.integers(min_value=0, max_value=2**31 - 1))
def test_fuzzed_inputs_give_one_paragraph_never_a_crash(seed):
    report = fuzz.run(50, seed=seed, timeout=60)
    assert report.cases == 50
    _assert_clean(report)


def test_every_kind_of_damage_is_covered():
    # One case of each kind with a fixed seed: a harness that stopped building a kind would pass
    # the random test above silently.
    for kind in fuzz.KINDS:
        report = fuzz.run(3, seed=7, kinds=(kind,), timeout=60)
        assert report.cases == 3
        _assert_clean(report)
