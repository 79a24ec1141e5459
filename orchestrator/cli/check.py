"""`dsorch plan --check`: plan again in memory and compare with the plan directories on disk.

Each target is a model spec planned with the command's flags (into ``--out`` or the default plan
directory) or a plan directory planned again from the inputs its plan.yaml recorded
(``orchestrator.compose.replan``), so that CI checks every committed plan with one line:
`dsorch plan --check plans/*/`. A plan directory with ``plots/`` has the plan's pictures redrawn in
memory and compared too (``orchestrator.cli.plots.PICTURES``), since plan.md embeds them; the
measured runs' ``steps.svg`` is not compared, as it depends on runs, not on the plan's inputs.

Exit status: 0 when every target is up to date, 1 when any is stale (its diff on stdout, why on
stderr), 2 when any could not be planned (with several targets, the others are still checked).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from orchestrator import __version__
from orchestrator.errors import DsorchError, OutputError
from orchestrator.plan.make import Plan

Planned = tuple[Plan, dict[str, str], Path]  # the plan, its files, the directory to compare them with


def check(targets: list[tuple[Path, Callable[[], Planned]]], shown: Callable[[Path], str]) -> int:
    """Check each target (a path as given, and how to plan it); the exit status. With one target a
    planning error propagates (one paragraph, exit 2, as for any command)."""
    stale: list[str] = []
    failed: list[str] = []
    for path, planned in targets:
        try:
            the_plan, files, out = planned()
            if not _up_to_date(the_plan, files, out, shown(out), recorded=path.is_dir()):
                stale.append(shown(out))
        except DsorchError as e:
            if len(targets) == 1:
                raise
            click.echo(f"dsorch plan --check: {shown(path)}: {e}", err=True)
            failed.append(shown(path))
    if len(targets) > 1 and (stale or failed):
        for what, names in (("stale", stale), ("could not be checked", failed)):
            if names:
                click.echo(f"dsorch plan --check: {len(names)} of {len(targets)} {what}: {', '.join(names)}", err=True)
    return 2 if failed else 1 if stale else 0


def _up_to_date(the_plan: Plan, files: dict[str, str], out: Path, shown: str, *, recorded: bool) -> bool:
    from orchestrator.plandir.diff import stale_inputs
    from orchestrator.plandir.writer import diff_plan_dir

    if not out.is_dir():
        raise OutputError(f"--check: {shown} is not a plan directory; write it first without --check.")
    if (out / "plots").is_dir():
        from orchestrator.cli.plots import pictures
        from orchestrator.plandir.reader import plan_dir_of

        files = {**files, **{f"plots/{name}": svg for name, svg in pictures(plan_dir_of(out, files)).items()}}
    diff = diff_plan_dir(out, files)
    if not diff:
        click.echo(f"{shown}: up to date ({len(files)} files).")
        return True
    click.echo(diff, nl=False)
    for line in stale_inputs(out, the_plan):
        click.echo(f"dsorch plan --check: {line}", err=True)
    if recorded:
        what, fix = "its recorded inputs", f"run `dsorch plan {shown}` to update it"
    else:
        what, fix = "these inputs", "rerun without --check to update it"
    click.echo(
        f"dsorch plan --check: {shown} differs from what dsorch {__version__} generates for {what}; {fix}.", err=True
    )
    return False
