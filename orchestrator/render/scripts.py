"""launch.sh and job.sbatch, rendered from the jinja2 templates in templates/.

Templates are strict (``StrictUndefined``: a missing value is an error, never an empty string)
and every value that reaches a shell is quoted with ``shlex.quote`` here, before rendering.
"""

from __future__ import annotations

import re
import shlex

import jinja2

from orchestrator.plan.make import Plan
from orchestrator.ports import slurm_master_port_lines
from orchestrator.render.megatron import checkpoint_dir
from orchestrator.resources import templates_dir
from orchestrator.spec.container import bind_list, container_argv, env_exports
from orchestrator.spec.sbatch import job_name, rank_env, sbatch_parameters

MASTER_PORT = 29500


def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def _common(plan: Plan) -> dict:
    p = plan.profile
    return {
        "version": plan.version,
        "spec_name": plan.spec.name,
        "cluster": p.name,
        "nodes": p.nodes,
        "gpus_per_node": p.gpus_per_node,
        "runtime": plan.runtime.name,
        # The templates branch on what the runtime's program reads, not on its name: Megatron-LM's
        # pretrain_gpt.py with megatron_args.txt, or the bundled entrypoint with plan.yaml.
        "megatron_args": plan.runtime.reads_megatron_args,
        "layout_short": plan.layout.short(),
    }


def launch_env(plan: Plan) -> list[tuple[str, str]]:
    """Every rank's environment (orchestrator.spec.sbatch.rank_env), shell-quoted for launch.sh, less what
    the plan must not have (``launch_unset``)."""
    drop = set(launch_unset(plan))
    return [(k, shlex.quote(str(v))) for k, v in rank_env(plan.profile).items() if k not in drop]


def launch_unset(plan: Plan) -> list[str]:
    """Variables launch.sh unsets: Megatron-FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS is not 1
    (validate_args: "FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset"), which profiles for
    Megatron's TP overlap set, and a login shell may have exported."""
    return ["CUDA_DEVICE_MAX_CONNECTIONS"] if plan.runtime.uses_fsdp(plan.layout.zero_stage) else []


def render_launch(plan: Plan) -> str:
    return (
        _env()
        .get_template("launch.sh.j2")
        .render(
            **_common(plan),
            master_port=MASTER_PORT,
            env=launch_env(plan),
            unset=launch_unset(plan),
            stop_handler=plan.runtime.stop_handler,
        )
    )


def _sbatch_value(v: str) -> str:
    return v if re.fullmatch(r"[A-Za-z0-9_.,:+@%/=-]+", v) else shlex.quote(v)


def sbatch_options(plan: Plan) -> list[tuple[str, str | None]]:
    """job.sbatch's lines for the profile's sbatch parameters: ``--KEY=VALUE``, or ``--KEY`` alone
    where the value is True (``--exclusive``), as submitit's ``_as_sbatch_flag`` writes them."""
    return [
        (key, None if value is True else _sbatch_value(str(value)))
        for key, value in sbatch_parameters(plan.profile.slurm).items()
    ]


def _megatron_save_dir(plan: Plan) -> str:
    """The checkpoint directory of a Megatron-LM plan as a shell word for job.sbatch: a relative
    --save is relative to the plan directory (launch.sh runs from there)."""
    d = checkpoint_dir(plan)
    return shlex.quote(d) if d.startswith("/") else '"$DSORCH_PLAN_DIR"/' + shlex.quote(d)


def _container(plan: Plan) -> dict:
    """job.sbatch's container values: the words before ``bash launch.sh`` on the srun line (srun's
    Pyxis options, or ``apptainer exec ... IMAGE``), the profile's mounts (the script adds the plan
    and run directories), and the host lines that pass env into an Apptainer container."""
    c = plan.profile.container
    if c is None:
        return {"container": None, "container_words": "", "container_mounts": "''", "container_env": []}
    srun, prefix = container_argv(c, plan.profile.backend == "nccl", '"$container_mounts"', shlex.quote)
    return {
        "container": c,
        "container_words": "".join(w + " " for w in [*srun, *prefix]),
        "container_mounts": shlex.quote(bind_list(c, [])),
        "container_env": env_exports(c),
    }


def render_sbatch(plan: Plan) -> str:
    s = plan.profile.slurm
    # A runtime started with megatron_args.txt saves where its --save says: job.sbatch's run directory.
    megatron = plan.runtime.reads_megatron_args
    return (
        _env()
        .get_template("job.sbatch.j2")
        .render(
            **_common(plan),
            job_name=job_name(plan.spec.name),
            gpus=plan.profile.backend == "nccl",
            cpus_per_node=s.cpus_per_task * plan.profile.gpus_per_node,
            slurm=s,
            sbatch_options=sbatch_options(plan),
            master_port_lines=slurm_master_port_lines(),
            megatron_save_dir=_megatron_save_dir(plan) if megatron else None,
            save_interval=plan.checkpoint.steps,
            train_iters=plan.spec.training.train_steps,
            **_container(plan),
        )
    )
