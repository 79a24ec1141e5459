"""plan.yaml as render/report.py writes it: each stack stated once, and its regenerate line, which
writes the same directory again. Its helpers (``run``, ``_doc``, ``_ranked``) serve the other tests of
written plan directories (test_plan_md, test_plots, test_diff, test_check)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.cli.main import main
from orchestrator.plan.layout import Layout


def run(runner, *args):
    return runner.invoke(main, [*map(str, args)], catch_exceptions=False)


def _doc(plan_dir: Path) -> dict:
    return yaml.safe_load((plan_dir / "plan.yaml").read_text())


def _ranked(doc: dict) -> list[dict]:
    """plan.yaml's ranked layouts with their stacks: the chosen one (the top level), then the alternatives."""
    return [doc, *doc["alternatives"]]


def test_plan_yaml_states_each_stack_once(runner, in_tmp):
    """The chosen section and the alternatives carry the stacks; explain.layouts names the same
    layouts in the same order with what only it says (chosen, vs_chosen), and no stack again."""
    out = in_tmp / "p"
    assert run(runner, "plan", "examples/llama3-70b.yaml", "--cluster", "dgx16", "--out", out).exit_code == 0
    doc = _doc(out)
    text = (out / "plan.yaml").read_text()
    assert text.count("memory_gib_per_gpu:") == text.count("time_breakdown_s:") == len(_ranked(doc))
    for L, s in zip(doc["explain"]["layouts"], _ranked(doc), strict=True):
        assert set(L) == {"layout", "chosen", "vs_chosen"}
        assert L["layout"] == Layout(**s["layout"]).short() and L["chosen"] == (s is doc)
        assert L["vs_chosen"] == pytest.approx(s["predicted"]["step_time_s"] / doc["predicted"]["step_time_s"] - 1,
                                               abs=1e-4)


def test_the_regenerate_line_of_a_plan_made_with_top_writes_the_same_directory(runner, in_tmp):
    """--top lists more alternatives in plan.yaml and plan.md; a regenerate line without it wrote
    another directory, and `plan --check` with the line's flags failed."""
    import shlex

    out = in_tmp / "p"
    assert run(runner, "plan", "examples/tiny.yaml", "--cluster", "local", "--top", "12", "--out", out).exit_code == 0
    command = _doc_header(out).split("Regenerate (model spec path relative to this directory): ", 1)[1]
    assert command.endswith(" --top 12")
    words = shlex.split(command.replace("<this dir>", shlex.quote(str(out))))[2:]
    words[0] = str(out / words[0])  # the spec path is relative to the plan directory
    r = run(runner, "plan", *words, "--check")
    assert r.exit_code == 0, r.output
    # The default lists as many as --top up to 8: the line leaves --top out.
    assert run(runner, "plan", "examples/tiny.yaml", "--cluster", "local", "--top", "3", "--out", out).exit_code == 0
    assert "--top" not in _doc_header(out)


def _doc_header(plan_dir: Path) -> str:
    return (plan_dir / "plan.yaml").read_text().splitlines()[1]
