"""`dsorch calibrate`: a cluster profile's efficiencies fitted to measured runs."""

from __future__ import annotations

import json
from pathlib import Path

import click

from orchestrator.cli.common import (
    UserError,
    cluster_option,
    cwd_project,
    load_cluster,
    open_registry,
    profiles_dir_option,
    resolve_profiles_dir,
)


@click.command(
    epilog="""\b
Examples:
  dsorch calibrate runs/tiny-1 --cluster local --out my-local.yaml
  dsorch calibrate measured.jsonl --cluster dgx16 --name dgx16-calibrated --out profiles/dgx16-calibrated.yaml
"""
)
@click.argument("metrics", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@cluster_option(
    "Profile whose efficiencies to fit; default $DSORCH_CLUSTER, then cluster in dsorch.yaml.",
)
@click.option(
    "--plan",
    "plan_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Plan directory the runs used (default: found next to each run's metrics file, or the job registry's).",
)
@click.option(
    "--name",
    default=None,
    help="Name of the calibrated profile (default: the --out file's name, else NAME-calibrated).",
)
@click.option(
    "--out",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the calibrated profile here (default: print it).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the fit report as JSON.")
@profiles_dir_option
def calibrate(metrics, cluster, plan_dir, name, out, as_json, profiles_dir):
    """Fit a profile's efficiencies to measured step times and write a calibrated profile.

    METRICS are run directories (or the metrics files in them) written by the training entrypoint, or
    record files (YAML/JSONL of {layout, model, step_time_s, peak_mem_gib}; see
    orchestrator/calibrate/__init__.py).
    """
    from orchestrator.calibrate import calibrate as fit
    from orchestrator.calibrate import calibrated_profile_yaml

    name = _profile_name(name, out)
    project = cwd_project()
    lp = load_cluster(project, project.cluster(cluster), resolve_profiles_dir(project, profiles_dir))
    calibrated, report = fit(list(metrics), lp.profile, plan_dir=plan_dir, plans_by_run=_registered_plans(plan_dir))
    text = calibrated_profile_yaml(calibrated, report, name=name)
    if out is not None:
        from orchestrator.plandir.writer import write_text_atomic

        write_text_atomic(out, text)
    doc = report.as_dict()
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    elif out is None:
        click.echo(text, nl=False)
    if not as_json:
        from orchestrator.cli.console import calibration_summary

        click.echo(calibration_summary(doc, out), err=out is None)


def _profile_name(name: str | None, out: Path | None) -> str | None:
    """A profile's name is its file's name (spec/cluster.py discover_profiles names profiles by
    their files' stems), so the profile written to --out FILE is named after FILE."""
    from orchestrator.run.trial import check_profile_name

    if out is None:
        if name is not None:
            check_profile_name(name)
        return name
    if name is not None and name != out.stem:
        raise UserError(
            f"--name {name} and --out {out}: a profile is found by its file's name ({out.stem}); leave --name "
            f"out, or write to {out.with_name(name + out.suffix)}."
        )
    check_profile_name(out.stem, given_as=f"--out {out}:")
    return out.stem


def _registered_plans(plan_dir: Path | None) -> dict[Path, Path]:
    """The plan directory of each run submitted from this experiment (the job registry), for run
    directories outside their plan's; none needed where --plan names it."""
    if plan_dir is not None:
        return {}
    root = cwd_project().root
    return {Path(r.run_dir).resolve(): (root / r.plan_dir).resolve() for r in open_registry().all() if r.run_dir}
