"""`dsorch doctor`: measure the cluster against its profile."""

from __future__ import annotations

import json
import sys

import click

from orchestrator.cli.common import (
    UserError,
    complete_cluster,
    cwd_project,
    display_path,
    load_cluster,
    make_console,
    profiles_dir_option,
    resolve_profiles_dir,
)


@click.command(epilog="""\b
Examples:
  dsorch doctor --cluster dgx16 --nodes 2          # two nodes are enough to see the fabric
  dsorch doctor --cluster dgx16 --nodes 2 --write  # store the figures in profiles/dgx16-doctor.yaml
""")
@click.option("--cluster", "-c", default=None, metavar="NAME", shell_complete=complete_cluster,
              help="Cluster profile; default $DSORCH_CLUSTER, then cluster in dsorch.yaml.")
@click.option("--nodes", type=click.IntRange(1, 1_000_000), default=None,
              help="Nodes to check (default the profile's); two show the inter-node fabric.")
@click.option("--max-size", type=click.IntRange(1, 16384), default=None, metavar="MIB",
              help="Largest message in MiB (default 256 on GPUs, 16 on CPU ranks).")
@click.option("--iters", type=click.IntRange(1, 10_000), default=None,
              help="Timed repetitions per size (default 20 on GPUs, 5 on CPU ranks).")
@click.option("--timeout", type=click.IntRange(1, 100_000), default=20, show_default=True, metavar="MIN",
              help="Time limit of the job, queueing included; the job is cancelled past it.")
@click.option("--write", is_flag=True,
              help="Store the measured bandwidths and latencies in PROFILES/<cluster>-doctor.yaml (extends the "
                   "profile).")
@click.option("--name", default=None, help="Name of the written profile (default <cluster>-doctor).")
@profiles_dir_option
def doctor(cluster, nodes, max_size, iters, timeout, write, name, profiles_dir):
    """Check that every rank reaches every other and measure all-reduce / all-gather bus bandwidth
    inside and across nodes (nccl-tests style), against the profile's figures. Submits one short
    job (SLURM, or this machine with a local profile) and waits for it."""
    import time

    from orchestrator.cli.console import doctor_report
    from orchestrator.run import doctor as doc_mod
    from orchestrator.run import slurm
    from orchestrator.run.submission import job_spec
    from orchestrator.spec import sbatch

    project = cwd_project()
    pdir = resolve_profiles_dir(project, profiles_dir)
    lp = load_cluster(project, project.cluster(cluster), pdir)
    profile = lp.profile.resized(nodes, None)
    slurm.check_scheduler(profile.executor)
    gpu = profile.backend == "nccl"
    max_bytes = (max_size or (256 if gpu else 16)) * 1024 * 1024
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    folder = (project.root / ".dsorch" / "doctor" / f"{profile.name}-{stamp}").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    spec = job_spec(profile, sbatch.job_name(f"doctor-{profile.name}"), time_min=timeout)
    job = doc_mod.DoctorJob(str(folder), max_bytes, iters or (20 if gpu else 5), gpu)
    job_id = slurm.submit(spec, folder, job)
    click.echo(f"submitted doctor job {job_id} ({profile.world_size} ranks on {profile.nodes} node(s) of "
               f"{profile.name}); files in {display_path(folder)}", err=True)
    con = make_console(stderr=True)
    state, error, last = "PENDING", None, None
    deadline = time.monotonic() + 60 * timeout + 60
    with con.status(f"doctor job {job_id}: {state}") as spinner:
        while True:
            state, error = slurm.job_state(spec.kind, folder, job_id, state)
            text = f"doctor job {job_id}: {state}"
            if con.is_terminal:
                spinner.update(text)
            elif text != last:
                click.echo(text, err=True)
            last = text
            if state not in ("SUBMITTED", "PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING"):
                break
            if time.monotonic() > deadline:
                slurm.cancel(spec.kind, job_id)
                raise UserError(f"the doctor job {job_id} did not finish within --timeout {timeout} min; it was "
                                f"cancelled. Is the partition busy? Try again with a larger --timeout.")
            time.sleep(1)
    result = folder / doc_mod.RESULT
    if state != "COMPLETED" or not result.is_file():
        raise UserError(f"the doctor job {job_id} ended {state}" + (f":\n{error}" if error else "") +
                        f"\nIts logs: {display_path(folder)}. A rank that cannot reach another fails at rendezvous or at "
                        f"the first collective; the log of the rank that failed first names it.")
    data = json.loads(result.read_text())
    make_console().print(doctor_report(data, profile, doc_mod.expected(profile)))
    if write:
        import yaml

        from orchestrator.run.trial import (
            PROFILE_HEADER,
            check_profile_name,
            write_profile,
        )

        name = name or f"{lp.profile.name}-doctor"
        check_profile_name(name)
        text = (f"{PROFILE_HEADER} doctor` from job {job_id}: {data['world_size']} ranks on {data['nodes']} node(s), "
                f"{data['backend']}.\n# Bandwidths are the measured bus bandwidth at large messages in the profile's "
                f"units; latencies from the smallest all-reduce.\n"
                + yaml.safe_dump(doc_mod.measured_profile_doc(lp.profile, data, name), sort_keys=False))
        path = write_profile(project, pdir, name, text)
        click.echo(f"wrote {display_path(path)}: plan with --cluster {name}")
    if not data["allreduce_ok"] or data["unreachable"]:
        sys.exit(1)
