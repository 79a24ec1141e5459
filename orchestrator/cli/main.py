"""The `dsorch` command. Thin: parse, call the core, print. Domain errors become one paragraph and
exit code 2 in one place, ``DsorchGroup``."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import sys
from pathlib import Path

import click

from orchestrator import __version__
from orchestrator.errors import DsorchError
from orchestrator.plan.layout import PINNABLE, RUNTIMES, Pins

EPILOG = """\b
Typical use:
  dsorch init --cluster dgx16                  # dsorch.yaml: default cluster, profiles, plans and runs dirs
  dsorch plan examples/llama3-70b.yaml         # writes plans/llama3-70b-dgx16/ (--out DIR to choose)
  dsorch plan examples/llama3-70b.yaml --check # exit 1 with a diff if the committed plan is stale
  dsorch submit --cluster dgx16                # the plan for dgx16 in plans/; --dry-run prints the sbatch script
  dsorch status; dsorch logs JOB --follow; dsorch cancel JOB
  dsorch plan examples/tiny.yaml --cluster local && dsorch submit --cluster local --wait
  dsorch profiles; dsorch validate plans/llama3-70b-dgx16; dsorch calibrate runs/... --cluster NAME
"""


def pin_options(*names: str, **overrides: dict):
    """The click options that pin layout axes (``orchestrator.plan.layout.PINNABLE``; ``names`` to
    offer only some, ``overrides`` to narrow an axis's range or help for one command), passed to the
    command as one ``pins`` argument."""
    axes = [dataclasses.replace(a, **overrides.get(a.name, {})) for a in PINNABLE if not names or a.name in names]

    def decorate(f):
        @functools.wraps(f)
        def with_pins(*args, **kwargs):
            return f(*args, pins=Pins(**{a.name: kwargs.pop(a.name) for a in axes}), **kwargs)

        for a in reversed(axes):
            kind = (click.Choice(a.choices) if a.choices else click.IntRange(a.low, a.high) if a.kind is int else None)
            with_pins = click.option(a.flag, a.name, type=kind, default=None, help=a.help)(with_pins)
        return with_pins

    return decorate


class UserError(click.ClickException):
    """A DsorchError at the CLI edge: message only, no traceback, exit code 2."""

    exit_code = 2

    def format_message(self) -> str:
        return self.message


def _fail(e: DsorchError) -> UserError:
    return UserError(str(e))


class DsorchGroup(click.Group):
    """The one place a domain error becomes one paragraph and exit code 2: every command raises
    DsorchError (orchestrator.errors) and this turns it into a UserError."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except DsorchError as e:
            raise _fail(e) from None
        except OSError as e:
            # The last net for the filesystem (a path too long, a disk full, permissions): the
            # modules raise DsorchError with a fix where they can; this keeps the rest one line.
            where = f"{e.filename}: " if e.filename else ""
            raise UserError(f"{where}{e.strerror or e}; check the path and that you can write there.") from None
        except RecursionError:
            raise UserError("the input is nested too deeply to be a dsorch file or path.") from None


def _console(stderr: bool = False):
    from rich.console import Console

    # Wide enough for the layout table when piped into a file or CI log.
    return Console(stderr=stderr, width=None if sys.stdout.isatty() else 140, highlight=False)


@click.group(cls=DsorchGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", "-V", prog_name="dsorch", message="%(prog)s %(version)s")
def main() -> None:
    """dsorch plans 3D-parallel LLM training for a SLURM cluster and writes the files to run it.

    Give it a model spec (examples/*.yaml) and a cluster profile (`dsorch profiles`); it searches
    every legal layout of tensor, pipeline and data parallelism, ZeRO stage, micro-batch,
    recomputation and sequence parallelism, predicts memory per GPU and step time for each, and
    writes a validated ds_config.json, Megatron-LM flags, a launch script and an sbatch job.
    """


# --------------------------------------------------------------------------------------------
# plan
# --------------------------------------------------------------------------------------------


# Shared by every command that resolves a cluster profile.
_profiles_dir_option = click.option(
    "--profiles-dir", type=click.Path(file_okay=False), default=None,
    help="Directory of your own cluster profiles (NAME.yaml); default $DSORCH_PROFILES_DIR, then profiles_dir "
         "in dsorch.yaml. A profile there wins over a shipped one of the same name.")


def _complete_cluster(ctx, param, incomplete: str) -> list[str]:
    """Shell completion of --cluster: the profiles this experiment directory sees."""
    try:
        from orchestrator.spec.cluster import discover_profiles

        project = _project()
        names = discover_profiles(_profiles_dir(project, ctx.params.get("profiles_dir")))
    except Exception:  # completion must never print a traceback into the shell
        return []
    return [n for n in sorted(names) if n.startswith(incomplete)]


def _project():
    from orchestrator.cli.project import load_project

    return load_project(Path.cwd())


def _profiles_dir(project, flag: str | None) -> str | None:
    """The profiles directory to use; one that does not exist is an error naming where it came from."""
    setting = project.profiles_dir(flag)
    if setting.value is not None and not Path(setting.value).is_dir():
        raise DsorchError(f"profiles directory {setting.describe()} does not exist; create it, or point "
                          f"--profiles-dir, $DSORCH_PROFILES_DIR or profiles_dir in dsorch.yaml at an existing one.")
    return setting.value


def _load_cluster(project, cluster, profiles_dir: str | None):
    """The profile a resolved cluster setting names; an error says where a defaulted name came from."""
    from orchestrator.spec.cluster import load_profile

    if cluster.value is None:
        raise DsorchError(f"no cluster given ({cluster.origin}). Pass --cluster NAME (see `dsorch profiles`), set "
                          f"$DSORCH_CLUSTER, or write a default with `dsorch init --cluster NAME`.")
    try:
        return load_profile(cluster.value, profiles_dir)
    except DsorchError as e:
        if cluster.origin == "--cluster":
            raise
        raise type(e)(f"cluster {cluster.describe()}: {e}") from None


@main.command(epilog=EPILOG)
@click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--cluster", "-c", default=None, metavar="NAME", shell_complete=_complete_cluster,
              help="Cluster profile name (see `dsorch profiles`); default $DSORCH_CLUSTER, then cluster in dsorch.yaml.")
@click.option("--out", "-o", type=click.Path(path_type=Path), default=None,
              help="Plan directory to write (ds_config.json, megatron_args.txt, launch.sh, job.sbatch, plan.yaml); "
                   "default PLANS_DIR/<spec>-<cluster>/ (plans_dir in dsorch.yaml, else plans/).")
@click.option("--no-write", is_flag=True, help="Print the plan only; write no files.")
@click.option("--plot", is_flag=True,
              help="Also draw the plan's pictures into PLAN_DIR/plots/ (as `dsorch plot` does).")
@click.option("--check", is_flag=True,
              help="Regenerate in memory and compare with the files in the plan directory; exit 1 with a diff if "
                   "they differ.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the plan as JSON on stdout (no table); writes the plan directory only with --out.")
@click.option("--explain", is_flag=True,
              help="Also show, for the chosen layout and each alternative, the memory and time stacks, the layouts "
                   "memory rejected and by how much, and whether the top two are within the model's error.")
@click.option("--runtime", type=click.Choice(RUNTIMES), default="deepspeed", show_default=True,
              help="deepspeed: dsorch's bundled entrypoint on DeepSpeed's pipeline engine (1F1B, ZeRO 0-3). "
                   "megatron: Megatron-LM's pretrain_gpt.py (interleaved 1F1B, distributed optimizer).")
@click.option("--nodes", type=click.IntRange(1, 1_000_000), default=None, help="Override the profile's node count.")
@click.option("--gpus-per-node", type=click.IntRange(1, 1024), default=None,
              help="Override the profile's GPUs (processes) per node, e.g. to plan for part of a node.")
@pin_options()
@click.option("--memory-margin", type=click.FloatRange(0, 1_000_000), default=0.0, show_default=True, metavar="GIB",
              help="Headroom to keep free on every GPU, in GiB.")
@click.option("--top", type=click.IntRange(1, 10_000), default=8, show_default=True, help="Rows in the table.")
@_profiles_dir_option
def plan(spec, cluster, out, no_write, plot, check, as_json, explain, runtime, nodes, gpus_per_node, pins, memory_margin,
         top, profiles_dir):
    """Search every legal layout for SPEC on a cluster, show the best, write the plan directory.

    Any part of the layout can be pinned (--tp 8 --pp 4 ...); the rest is searched. With every
    part pinned, exactly that layout is evaluated, and if it does not fit you are told by how much.
    """
    from orchestrator.compose import plan_files
    from orchestrator.spec.model import load_spec
    from orchestrator.plandir.writer import diff_plan_dir, spec_path_in, write_plan_dir

    _ds_env()
    if not math.isfinite(memory_margin):  # click's FloatRange lets nan through (nan < 0 is false)
        raise UserError(f"--memory-margin {memory_margin}: give a number of GiB, e.g. 2.")
    if out is not None:
        _check_path(out, "--out")
    if check and no_write:
        raise UserError("--check compares with the plan directory and --no-write writes none; pass one of them.")
    if no_write and out is not None:
        raise UserError("--no-write writes no plan directory and --out names one; pass one of them.")
    if plot and (no_write or check or (as_json and out is None)):
        raise UserError("--plot draws into the plan directory it writes; drop --no-write/--check, give --json an "
                        "--out, or run `dsorch plot PLAN_DIR` on a written plan.")
    project = _project()
    spec_file, loaded = load_spec(spec)
    setting = project.cluster(cluster)
    lp = _load_cluster(project, setting, _profiles_dir(project, profiles_dir))
    default_out = out is None
    if out is None and (check or not (no_write or as_json)):
        out = project.default_plan_dir(spec_file.name, lp.profile.name, runtime, nodes, gpus_per_node)
    the_plan, files = plan_files(spec_file, spec_path_in(spec, out), loaded.sha256, lp, runtime, pins, nodes=nodes,
                                 gpus_per_node=gpus_per_node, memory_margin_gib=memory_margin, keep=max(top, 8),
                                 shown_path=str(spec))
    shown = _shown(out) if out is not None else None
    if check:
        if not out.is_dir():
            raise UserError(f"--check: {shown} is not a plan directory; write it first without --check.")
        diff = diff_plan_dir(out, files)
        if diff:
            from orchestrator.plandir.diff import stale_inputs

            click.echo(diff, nl=False)
            for line in stale_inputs(out, the_plan):
                click.echo(f"dsorch plan --check: {line}", err=True)
            click.echo(f"dsorch plan --check: {shown} differs from what dsorch {__version__} generates for these "
                       f"inputs; rerun without --check to update it.", err=True)
            sys.exit(1)
        click.echo(f"{shown}: up to date ({len(files)} files).")
        return
    if out is not None:
        write_plan_dir(out, files)
        if plot:
            _draw(out, out / "plots", [])

    if as_json:
        from orchestrator.render.report import render_json

        click.echo(render_json(the_plan), nl=False)
        return
    from orchestrator.cli.console import print_plan

    print_plan(_console(), the_plan, top, shown, files, cluster_note=None if setting.origin == "--cluster" else setting,
               default_out=default_out)
    if explain:
        from orchestrator.render.explain import explain_text

        click.echo()
        click.echo(explain_text(the_plan), nl=False)


def _check_path(p: Path, flag: str) -> None:
    """A path the filesystem can hold: each name at most 255 bytes, 4096 in all, 256 levels deep."""
    text = os.fsencode(str(p))
    if len(text) > 4096 or len(p.parts) > 256 or any(len(os.fsencode(part)) > 255 for part in p.parts):
        raise UserError(f"{flag}: the path is too long or too deep for a filesystem (names of at most 255 bytes, "
                        f"4096 in all); choose a shorter one.")


def _shown(p: Path) -> str:
    """A path as the user should read it: relative to the working directory when below it."""
    try:
        return Path(os.path.relpath(os.path.abspath(p))).as_posix()
    except ValueError:
        return str(p)


# --------------------------------------------------------------------------------------------
# plot
# --------------------------------------------------------------------------------------------


def _draw(plan_dir: Path, out: Path, runs: list[Path]) -> None:
    from orchestrator.plandir.reader import load_plan_dir
    from orchestrator.cli.plots import draw_all

    pd = load_plan_dir(plan_dir)
    for path in draw_all(pd, out, runs):
        click.echo(f"wrote {_shown(path)}")


@main.command(epilog="""\b
Examples:
  dsorch plot plans/llama3-70b-dgx16                 # plots/ in the plan directory
  dsorch plot plans/tiny-local --run runs/tiny-local-1   # with a run's measured steps
""")
@click.argument("plan_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory for the SVG files; default PLAN_DIR/plots/.")
@click.option("--run", "runs", multiple=True, type=click.Path(file_okay=False, path_type=Path),
              help="A run directory (with metrics.jsonl) to draw against the prediction; repeatable. Default: "
                   "the runs of this plan in the job registry.")
def plot(plan_dir, out, runs):
    """Draw a plan: memory per GPU and time per step of the chosen layout and the alternatives, the
    chosen layout's pipeline schedule, and, when runs exist, measured step time and loss per step
    against the prediction. SVG, byte-identical for the same plan and runs."""
    if out is not None:
        _check_path(out, "--out")
    runs = list(runs)
    missing = [r for r in runs if not (r / "metrics.jsonl").is_file()]
    if missing:
        raise UserError(f"--run {missing[0]}: no metrics.jsonl there; give a run directory the training "
                        f"entrypoint wrote (`dsorch status` shows each job's run directory).")
    if not runs:
        here = plan_dir.resolve()
        for job in _registry().all() if (_project().root / ".dsorch").is_dir() else []:
            if Path(job.plan_dir).resolve() == here and Path(job.run_dir) not in runs:
                runs.append(Path(job.run_dir))
    _draw(plan_dir, out if out is not None else plan_dir / "plots", sorted(runs))


# --------------------------------------------------------------------------------------------
# diff
# --------------------------------------------------------------------------------------------


@main.command(epilog="""\b
Examples:
  dsorch diff plans/llama3-70b-dgx16 plans/llama3-70b-dgx16-32n
  git worktree add /tmp/base main && dsorch diff /tmp/base/plans/x plans/x   # what a pull request changes
""")
@click.argument("plan_a", type=click.Path(file_okay=False, path_type=Path))
@click.argument("plan_b", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def diff(plan_a, plan_b, as_json):
    """What changed from plan directory PLAN_A to PLAN_B: inputs, layout, memory per GPU, predicted
    step time and MFU, the Megatron-LM flags and ds_config.json keys, and the other files that differ."""
    from orchestrator.plandir.diff import diff_plans, diff_text
    from orchestrator.plandir.reader import load_plan_dir

    d = diff_plans(load_plan_dir(plan_a), load_plan_dir(plan_b))
    if as_json:
        click.echo(json.dumps(d.as_dict(), indent=2))
        return
    click.echo(diff_text(d, _shown(plan_a), _shown(plan_b)), nl=False)


# --------------------------------------------------------------------------------------------
# completion
# --------------------------------------------------------------------------------------------


@main.command(epilog="""\b
Examples:
  dsorch completion bash > ~/.dsorch-complete.bash && echo '. ~/.dsorch-complete.bash' >> ~/.bashrc
  dsorch completion zsh > ~/.dsorch-complete.zsh   # then source it from ~/.zshrc
  dsorch completion fish > ~/.config/fish/completions/dsorch.fish
""")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell):
    """Print the shell completion script for dsorch (click's shell completion: commands, options,
    choices and paths)."""
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    click.echo(cls(main, {}, "dsorch", "_DSORCH_COMPLETE").source())


# --------------------------------------------------------------------------------------------
# import-hf
# --------------------------------------------------------------------------------------------


@main.command("import-hf", epilog="""\b
Examples:
  dsorch import-hf Meta-Llama-3-8B/config.json --out specs/llama3-8b.yaml
  dsorch import-hf config.json --seq-length 4096 --global-batch-size 1024 --name qwen2-7b
""")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Spec file to write; default: print it.")
@click.option("--name", default=None, help="The spec's name; default the config's _name_or_path, else its folder.")
@click.option("--seq-length", type=click.IntRange(1, 100_000_000), default=None,
              help="training.seq_length; default max_position_embeddings, at most 8192.")
@click.option("--global-batch-size", type=click.IntRange(1, 100_000_000), default=None,
              help="training.global_batch_size in sequences; default about 4M tokens per step.")
@click.option("--force", is_flag=True, help="Overwrite an existing --out file.")
def import_hf(config, out, name, seq_length, global_batch_size, force):
    """Make a model spec from a Hugging Face config.json (Llama, Mistral, Qwen2, Gemma, GPT-NeoX,
    GPT-2, Falcon), offline. What the spec cannot express (mixture of experts, a sliding window
    shorter than the sequence, ...) is refused with the key; what changes only the numerics (RoPE
    scaling, ...) is said and noted in the spec's source."""
    import yaml

    from pydantic import ValidationError

    from orchestrator.spec.hf_import import import_config, spec_document
    from orchestrator.spec.model import SpecFile
    from orchestrator.plandir.writer import write_text_atomic

    if out is not None:
        _check_path(out, "--out")
        if out.exists() and not force:
            raise UserError(f"--out {out} exists; pass --force to overwrite it, or choose another path.")
    imp = import_config(config, name)
    doc = spec_document(imp, f"Hugging Face config.json ({imp.family}), imported by dsorch import-hf",
                        seq_length, global_batch_size)
    try:
        SpecFile.model_validate(doc)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()[:5])
        raise UserError(f"{config}: the imported spec is not valid: {problems}. Fix it with --seq-length / "
                        f"--global-batch-size, or write the spec by hand.")
    text = ("# Imported from a Hugging Face config.json by `dsorch import-hf`. The model section is the\n"
            "# config's; the training section is a starting point: set the sequence, batch and length you train.\n"
            + yaml.safe_dump(doc, sort_keys=False, width=100))
    for note in imp.notes:
        click.echo(f"note: not carried: {note}.", err=True)
    if out is None:
        click.echo(text, nl=False)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, text)
    click.echo(f"wrote {_shown(out)}: {imp.family}, {doc['model']['num_layers']} layers, hidden "
               f"{doc['model']['hidden_size']}; next: dsorch plan {_shown(out)}", err=False)


# --------------------------------------------------------------------------------------------
# profiles
# --------------------------------------------------------------------------------------------


@main.command()
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_profiles_dir_option
def profiles(name, as_json, profiles_dir):
    """List cluster profiles, or show one (NAME) with `extends` resolved."""
    import yaml

    from orchestrator.spec.cluster import discover_profiles, load_profile

    pdir = _profiles_dir(_project(), profiles_dir)
    if name:
        lp = load_profile(name, pdir)
        doc = {"source": {"origin": lp.source.origin, "path": str(lp.source.path)},
               **lp.profile.model_dump(mode="json")}
        if as_json:
            click.echo(json.dumps(doc, indent=2))
        else:
            click.echo(yaml.safe_dump(doc, sort_keys=False), nl=False)
        return
    rows = []
    for pname, src in sorted(discover_profiles(pdir).items()):
        try:
            p = load_profile(pname, pdir).profile
        except DsorchError as e:  # one broken profile must not hide the others
            rows.append({"name": pname, "origin": src.origin, "path": str(src.path), "nodes": None,
                         "gpus_per_node": None, "gpu": None, "gpu_memory_gib": None,
                         "description": f"INVALID: {' '.join(str(e).split())}"})
            continue
        rows.append({"name": pname, "origin": src.origin, "path": str(src.path), "nodes": p.nodes,
                     "gpus_per_node": p.gpus_per_node, "gpu": p.gpu.name, "gpu_memory_gib": p.gpu.memory_gib,
                     "description": p.description})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    from orchestrator.cli.console import profile_table

    _console().print(profile_table(rows))


# --------------------------------------------------------------------------------------------
# init
# --------------------------------------------------------------------------------------------


@main.command(epilog="""\b
Examples:
  dsorch init --cluster dgx16                       # in your experiment repository
  dsorch init --cluster mycluster --profiles-dir profiles   # your own profile in profiles/mycluster.yaml
""")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path), default=".")
@click.option("--cluster", "-c", default=None, metavar="NAME", shell_complete=_complete_cluster, help="Default cluster profile of this repository.")
@click.option("--profiles-dir", default=None, metavar="DIR",
              help="Directory of your own cluster profiles, relative to DIRECTORY.")
@click.option("--plans-dir", default="plans", show_default=True, metavar="DIR",
              help="Where `dsorch plan SPEC` writes plan directories, relative to DIRECTORY.")
@click.option("--runs-dir", default="runs", show_default=True, metavar="DIR",
              help="Where `dsorch submit` writes checkpoints and metrics, relative to DIRECTORY.")
@click.option("--force", is_flag=True, help="Overwrite an existing dsorch.yaml.")
def init(directory, cluster, profiles_dir, plans_dir, runs_dir, force):
    """Write dsorch.yaml for an experiment repository: its default cluster, profiles, plans and runs.

    Every dsorch command run in DIRECTORY or below then uses these defaults (flags and the
    environment override them), and keeps its job registry in DIRECTORY/.dsorch/.
    """
    from orchestrator.cli.project import CONFIG_NAME, ignore_lines, render_config
    from orchestrator.spec.cluster import load_profile
    from orchestrator.plandir.writer import write_text_atomic

    target = directory / CONFIG_NAME
    for flag, value in (("--profiles-dir", profiles_dir), ("--plans-dir", plans_dir), ("--runs-dir", runs_dir)):
        if value is not None and (Path(value).is_absolute() or ".." in Path(value).parts or "\n" in value):
            raise UserError(f"{flag} {value!r}: give a path inside {directory}, relative to it, so the "
                            f"repository works wherever it is cloned.")
    if target.exists() and not force:
        raise UserError(f"{target} exists; edit it, or pass --force to overwrite it.")
    if profiles_dir is not None and not (directory / profiles_dir).is_dir():
        raise UserError(f"--profiles-dir {profiles_dir}: {directory / profiles_dir} is not a directory; create it "
                        f"and put your cluster profiles (NAME.yaml) in it first.")
    if cluster is not None:
        load_profile(cluster, directory / profiles_dir if profiles_dir else None)
    ignore = directory / ".gitignore"
    old = ignore.read_text(encoding="utf-8", errors="replace") if ignore.is_file() else ""
    missing = [line for line in ignore_lines(plans_dir, runs_dir) if line not in old.splitlines()]
    write_text_atomic(target, render_config(cluster, profiles_dir, plans_dir, runs_dir))
    if missing:
        sep = "" if not old or old.endswith("\n") else "\n"
        write_text_atomic(ignore, old + sep + "\n".join(["# dsorch: job registry, checkpoints, logs", *missing]) + "\n")
    click.echo(f"wrote {_shown(target)}" + (f": default cluster {cluster}" if cluster else ": no default cluster "
                                            "(add one with `cluster: NAME`)"))
    if missing:
        click.echo(f"{'added to' if old else 'wrote'} {_shown(ignore)}: {' '.join(missing)}")
    click.echo(f"  next: dsorch plan SPEC  ->  {plans_dir}/<spec>-<cluster>/;  dsorch submit [--cluster NAME]")
    click.echo(f"  commit dsorch.yaml and {plans_dir}/ (what runs writes there is ignored)")


# --------------------------------------------------------------------------------------------
# validate
# --------------------------------------------------------------------------------------------


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--dp", type=click.IntRange(1, 1_000_000_000), default=None,
              help="Data-parallel size to check a single ds_config.json at (a plan directory records its own).")
def validate(path, dp):
    """Re-validate a plan directory (or one ds_config.json) with DeepSpeed's own config classes and
    Megatron-LM's argument definitions."""
    from orchestrator.validate.plan_dir import validate_path

    _ds_env()
    errors = validate_path(path, dp)
    if errors:
        raise UserError(f"{path}: {len(errors)} problem(s):\n  " + "\n  ".join(errors))
    click.echo(f"{path}: valid")


def _ds_env() -> None:
    # DeepSpeed picks an accelerator at import; on a CPU-only login node that is the CPU one, and
    # saying so up front silences its warning. Validation needs no accelerator either way.
    os.environ.setdefault("DS_ACCELERATOR", "cpu")



# --------------------------------------------------------------------------------------------
# submit / status / logs / cancel
# --------------------------------------------------------------------------------------------


def _registry():
    """The job registry of the experiment directory (where dsorch.yaml is, else the working directory)."""
    from orchestrator.run.registry import Registry

    return Registry(_project().root)


@main.command(epilog="""\b
Examples:
  dsorch submit plans/llama3-70b-dgx16          # to the cluster the plan was made for
  dsorch submit --cluster dgx16                 # the one plan for dgx16 in plans/ (or this plan directory)
  dsorch submit plans/llama3-70b-dgx16 --dry-run   # print the sbatch script, submit nothing
  dsorch submit plans/tiny-local --wait         # a plan for `local` runs on this machine
""")
@click.argument("plan_dir", type=click.Path(path_type=Path), required=False)
@click.option("--cluster", "-c", default=None, metavar="NAME", shell_complete=_complete_cluster,
              help="Cluster to run on; default: the one the plan was made for. Without PLAN_DIR it picks the plan: "
                   "this directory if it is one, else the one plan for the cluster (--cluster, $DSORCH_CLUSTER or "
                   "dsorch.yaml) in the plans directory. `local` runs on this machine.")
@click.option("--nodes", type=click.IntRange(1, 1_000_000), default=None,
              help="Node count you expect; refused when the plan was made for another.")
@click.option("--steps", type=click.IntRange(1, 1_000_000_000_000), default=None, help="Training steps (default: the plan's).")
@click.option("--data", type=click.Path(dir_okay=False), default=None,
              help="Token file NAME (NAME.bin + NAME.json) to train on (default: deterministic synthetic tokens).")
@click.option("--save-interval", type=click.IntRange(0, 1_000_000_000_000), default=0, show_default=True,
              help="Checkpoint every N steps (0: only at the end and when preempted).")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where checkpoints and metrics.jsonl go; default runs/<plan>-<key>.")
@click.option("--resume", is_flag=True,
              help="Continue the newest job of this plan: its run directory, from its newest intact checkpoint "
                   "(after a failure or a cancel).")
@click.option("--resume-from", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="RUN_DIR",
              help="Continue the run in RUN_DIR with this plan, from its newest checkpoint: one this plan's layout "
                   "wrote, or the conversion `dsorch replan RUN_DIR` made for it.")
@click.option("--dry-run", is_flag=True, help="Print the sbatch script submitit would submit; submit nothing.")
@click.option("--force", is_flag=True, help="Submit even if a job of this plan is pending or running.")
@click.option("--wait", is_flag=True, help="Wait for the job to finish and print its final state.")
@_profiles_dir_option
def submit(plan_dir, cluster, nodes, steps, data, run_dir, save_interval, resume, resume_from, dry_run, force, wait,
           profiles_dir):
    """Submit PLAN_DIR as a job running dsorch's training entrypoint (SLURM through submitit, or local)."""
    from orchestrator.run import scheduler
    from orchestrator.cli.project import find_plan
    from orchestrator.run.registry import Registry
    from orchestrator.run.submission import prepare_submission, record_submission

    _ds_env()
    project = _project()
    if plan_dir is None:
        plan_dir = find_plan(project, Path.cwd(), project.cluster(cluster))
        click.echo(f"plan: {_shown(plan_dir)}", err=True)
    reg = Registry(project.root)
    if resume and run_dir is not None:
        raise UserError("--resume continues the newest run of the plan and --run-dir names one; pass one of them.")
    if resume_from is not None:
        if resume or run_dir is not None:
            raise UserError("--resume-from names the run to continue; pass it without --resume or --run-dir.")
        if not (resume_from / "checkpoints").is_dir():
            raise UserError(f"--resume-from {resume_from}: no checkpoints/ in it, so there is nothing to resume from; "
                            f"name the run directory of the job to continue (`dsorch status` shows them).")
        run_dir = resume_from
    sub = prepare_submission(plan_dir, cluster, nodes, steps, data, run_dir,
                             _profiles_dir(project, profiles_dir), project.root, save_interval,
                             runs_dir=project.runs_dir)
    if resume:
        from dataclasses import replace

        earlier = [r for r in reg.all() if r.plan_dir == sub.plan_display and r.run_dir]
        if not earlier:
            raise UserError(f"--resume: no earlier job of {sub.plan_display} in this experiment directory; submit "
                            f"without --resume.")
        previous = earlier[-1].run_dir
        sub = replace(sub, run_dir=Path(previous), job=replace(sub.job, run_dir=previous))
        click.echo(f"resuming job {earlier[-1].job_id}'s run: {previous}", err=True)
    if dry_run:
        if sub.spec.kind == "local":
            click.echo(f"# --cluster local: {sub.spec.tasks_per_node} processes on this machine through "
                       f"submitit's LocalExecutor (no sbatch script).", err=True)
        else:
            click.echo(scheduler.sbatch_script(sub.spec, sub.folder), nl=False)
        return
    scheduler.check_scheduler(sub.spec.kind, dry_run="prints the sbatch script")
    record = record_submission(reg, sub, force)
    click.echo(f"submitted job {record.job_id} ({record.executor}, cluster {record.cluster}): plan {record.plan_dir}, "
               f"run dir {record.run_dir}")
    click.echo(f"  logs: dsorch logs {record.job_id} [--rank N] [--follow]    status: dsorch status")
    if wait:
        from orchestrator.plandir.reader import load_plan_dir

        # The entrypoint trains to --steps, else the plan's length, else 20 (orchestrator/train/entry.py).
        _wait_for(record.key, steps or load_plan_dir(sub.plan_dir).spec.training.train_steps or 20)


def _wait_for(key: int, total_steps: int | None = None) -> None:
    """Poll the job until it ends. On a terminal: a progress bar of steps (the entrypoint's
    metrics.jsonl) against ``total_steps``; elsewhere a line per change of state."""
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from orchestrator.run.submission import refresh

    reg = _registry()
    con = _console(stderr=True)
    last = None
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=con, disable=not con.is_terminal, transient=True) as bar:
        task = bar.add_task("queued", total=total_steps)
        while True:
            rec = refresh(reg, reg.get(str(key)))
            loss = f", loss {rec.last_loss:.4f}" if rec.last_loss is not None else ""
            bar.update(task, completed=rec.last_step or 0, description=f"job {rec.job_id}: {rec.state}{loss}")
            if not con.is_terminal and rec.state != last:
                click.echo(f"job {rec.job_id}: {rec.state}", err=True)
            last = rec.state
            if not rec.active:
                break
            time.sleep(2)
    click.echo(f"job {rec.job_id}: {rec.state}" + (f" at step {rec.last_step}, loss {rec.last_loss:.4f}"
                                                    if rec.last_step is not None else ""))
    if rec.state != "COMPLETED":
        if rec.error:
            click.echo(_tail(rec.error, 15), err=True)
        sys.exit(1)


def _tail(text: str, n: int) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--all", "show_all", is_flag=True, help="Also show the traceback tail of every failed job.")
@click.option("--repair", is_flag=True,
              help="Repair a damaged job registry: keep it aside as jobs.sqlite.damaged-<time>, copy every row that "
                   "still reads into a new one.")
def status(as_json, show_all, repair):
    """Jobs submitted from this experiment directory: id, plan, state, elapsed, requeues, last step/loss."""
    from orchestrator.run.submission import refresh

    reg = _registry()
    if repair:
        kept, lost, backup = reg.repair()
        if backup is None:
            click.echo(f"{reg.path}: intact ({kept} job(s)); nothing to repair.")
        else:
            click.echo(f"{reg.path}: repaired; {kept} job(s) kept, {lost} unreadable; the damaged file is {backup}.")
        return
    records = [refresh(reg, r) for r in reg.all()]
    if as_json:
        from dataclasses import asdict

        click.echo(json.dumps([asdict(r) for r in records], indent=2))
        return
    if not records:
        click.echo("no jobs submitted from this experiment directory yet (dsorch submit [PLAN_DIR])")
        return
    from orchestrator.cli.console import job_table

    con = _console()
    con.print(job_table(records))
    import shutil

    if any(r.executor == "slurm" and r.active for r in records) and shutil.which("sacct") is None:
        con.print("note: sacct is not on PATH here, so SLURM jobs show the state last seen; run `dsorch status` on "
                  "the cluster's login node for the current one.", markup=False)
    for r in records:
        if r.state not in ("COMPLETED", "CANCELLED") and r.error and (show_all or r is records[-1] or not r.active):
            con.print(f"\njob {r.job_id} {r.state}: last lines of the error (full log: {r.log_dir}):", markup=False)
            con.print(_tail(r.error, 8), markup=False, highlight=False)


@main.command()
@click.argument("job")
@click.option("--rank", type=click.IntRange(0, 10_000_000), default=0, show_default=True, help="Which task's log.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the job ends.")
def logs(job, rank, follow):
    """Print a job's log (stdout, then stderr) for one rank."""
    import shutil
    import time

    from orchestrator.run import scheduler
    from orchestrator.run.submission import refresh

    reg = _registry()
    rec = reg.get(job)
    out, err = scheduler.log_paths(Path(rec.log_dir), rec.job_id, rank)
    if not follow:
        if not out.exists() and not err.exists():
            raise UserError(f"no log for rank {rank} of job {rec.job_id} yet in {rec.log_dir} (state {rec.state}); "
                            f"a pending job has none, and ranks go from 0 to world size - 1.")
        for path in (out, err):
            if path.exists():
                click.echo(f"==> {path} <==")
                click.echo(path.read_text(errors="replace"), nl=False)
        return
    offsets = {out: 0, err: 0}
    while True:
        for path in (out, err):
            if path.exists():
                with open(path, errors="replace") as fh:
                    fh.seek(offsets[path])
                    chunk = fh.read()
                    offsets[path] = fh.tell()
                if chunk:
                    click.echo(chunk, nl=False)
        rec = refresh(reg, reg.get(job))
        if not rec.active:
            break
        if rec.executor == "slurm" and shutil.which("sacct") is None:
            click.echo(f"dsorch logs: sacct is not on PATH here, so the end of job {rec.job_id} cannot be seen; "
                       f"stopped following (the job goes on).", err=True)
            break
        time.sleep(1)


@main.command()
@click.argument("job")
def cancel(job):
    """Cancel a pending or running job."""
    from orchestrator.run import scheduler

    reg = _registry()
    rec = reg.get(job)
    if not rec.active:
        raise UserError(f"job {rec.job_id} is already {rec.state}; nothing to cancel.")
    if rec.job_id != "pending":  # a row whose submission never reached the scheduler
        scheduler.cancel(rec.executor, rec.job_id)
    reg.update(rec.key, state="CANCELLED")
    click.echo(f"cancelled job {rec.job_id}")


# --------------------------------------------------------------------------------------------
# replan
# --------------------------------------------------------------------------------------------


@main.command(epilog="""\b
Examples:
  dsorch replan runs/llama3-8b-dgx16-3 --nodes 12      # a run dir
  dsorch replan 41234 --nodes 12                         # or the job that wrote it
  dsorch submit plans/llama3-8b-dgx16-12n --resume-from runs/llama3-8b-dgx16-3
""")
@click.argument("run", metavar="RUN_DIR|JOB")
@click.option("--nodes", type=click.IntRange(1, 1_000_000), default=None, help="Nodes to go on with.")
@click.option("--gpus-per-node", type=click.IntRange(1, 1024), default=None,
              help="GPUs (processes) per node to go on with (default: as planned).")
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The new plan directory (default: the old one's name plus -<N>n).")
@pin_options("tp", "pp", "dp", "zero_stage", "micro_batch_size",
             zero_stage=dict(low=1, high=2, help="Pin the ZeRO stage (1 or 2: what converts)."),
             micro_batch_size=dict(help="Pin the micro-batch size."))
@_profiles_dir_option
def replan(run, nodes, gpus_per_node, out, pins, profiles_dir):
    """Re-plan a run for another number of nodes and convert its newest checkpoint to the new layout.

    The same spec and global batch, planned for the new world; the fastest layout DeepSpeed's
    universal checkpoint can convert to (ZeRO-1/2) is chosen; the newest intact checkpoint is
    converted beside it (checkpoints/universal_stepN). Continue with `dsorch submit NEW_PLAN
    --resume-from RUN_DIR`: step, LR schedule and optimizer state carry over, metrics.jsonl goes on.
    """
    from orchestrator.run.replan import find_run
    from orchestrator.run.replan import replan as do_replan

    _ds_env()
    if nodes is None and gpus_per_node is None:
        raise UserError("pass --nodes N (and/or --gpus-per-node G): the world to go on with.")
    project = _project()
    run_dir = find_run(project, run)
    r = do_replan(project, run_dir, nodes, gpus_per_node, pins, out, _profiles_dir(project, profiles_dir))
    p = r.plan
    click.echo(f"{_shown(run_dir)}: checkpoint of step {r.step}, layout {r.source.short()}")
    click.echo(f"re-planned for {p.profile.nodes} x {p.profile.gpus_per_node} of {p.profile.name}: {p.layout.short()}, "
               f"{p.chosen.memory_gib['total']:.1f} GiB per GPU, predicted {p.chosen.step_time_s:.3g} s/step "
               f"(global batch {p.layout.global_batch_size} kept)")
    click.echo(f"wrote {_shown(r.out)}/; converted the checkpoint to {_shown(r.universal)}/ (DeepSpeed universal)")
    click.echo(f"  continue: dsorch submit {_shown(r.out)} --resume-from {_shown(run_dir)}")


# --------------------------------------------------------------------------------------------
# trial
# --------------------------------------------------------------------------------------------


@main.command(epilog="""\b
Examples:
  dsorch trial examples/tiny.yaml --cluster local --top 2 --wait
  dsorch trial examples/llama3-8b.yaml --cluster dgx16 --nodes 2 --steps 30     # submit and return
  dsorch trial --status trials/llama3-8b-dgx16-2n
  dsorch trial --collect trials/llama3-8b-dgx16-2n [--wait]
""")
@click.argument("target", metavar="SPEC_OR_TRIAL_DIR", type=click.Path(path_type=Path))
@click.option("--cluster", "-c", default=None, metavar="NAME", shell_complete=_complete_cluster,
              help="Cluster profile to measure on; default $DSORCH_CLUSTER, then cluster in dsorch.yaml.")
@click.option("--top", type=click.IntRange(1, 100), default=3, show_default=True,
              help="Layouts measured by rank; the best layout of every other family is measured besides.")
@click.option("--steps", type=click.IntRange(5, 100_000), default=20, show_default=True,
              help="Steps per trial; the first fifth is warm-up and not measured.")
@click.option("--nodes", type=click.IntRange(1, 1_000_000), default=None, help="Override the profile's node count.")
@click.option("--gpus-per-node", type=click.IntRange(1, 1024), default=None,
              help="Override the profile's GPUs (processes) per node.")
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Trial directory to write (default trials/<spec>-<cluster>/).")
@click.option("--dry-run", is_flag=True, help="Show the trials and their cost; write and submit nothing.")
@click.option("--wait", is_flag=True, help="Wait for every trial (progress on stderr), then collect.")
@click.option("--status", "show_status", is_flag=True, help="SPEC_OR_TRIAL_DIR is a trial directory: show its trials.")
@click.option("--collect", is_flag=True,
              help="SPEC_OR_TRIAL_DIR is a trial directory whose trials ended: compare, calibrate, re-plan.")
@click.option("--name", default=None, help="Name of the calibrated profile (default: <cluster>-measured).")
@_profiles_dir_option
def trial(target, cluster, top, steps, nodes, gpus_per_node, out, dry_run, wait, show_status, collect, name,
          profiles_dir):
    """Measure the top layouts of SPEC on the cluster, calibrate its profile from them, re-plan.

    The top layouts by prediction, and the best of every other family (ZeRO-3, pipeline, TP-heavy,
    data parallel), run as one job array of short runs of the bundled entrypoint on synthetic
    tokens. Once they end (--wait, or later --collect), predicted and measured step time and
    memory are compared, the profile is calibrated from them (PROFILES/<cluster>-measured.yaml,
    extending the original) and the spec re-planned with it into PLANS_DIR, with the trials as
    evidence in plan.yaml. A trial that runs out of memory, hangs or fails is reported as such.
    """
    from orchestrator.run import trial as trials
    from orchestrator.cli.console import trial_cost_text, trial_proposal_table, trial_state_table

    _ds_env()
    if show_status and collect:
        raise UserError("--status shows the trials and --collect finishes them; pass one of them.")
    if name is not None:
        trials.check_profile_name(name)  # before anything is submitted
    project = _project()
    pdir = _profiles_dir(project, profiles_dir)
    reg = _registry()
    con = _console()
    if show_status or collect:
        for flag, given in (("--cluster", cluster), ("--out", out), ("--nodes", nodes), ("--dry-run", dry_run)):
            if given:
                raise UserError(f"{flag} belongs to starting trials; --status/--collect take only the trial directory.")
        manifest = trials.load_manifest(target)
        if show_status:
            records = trials.states(reg, manifest)
            con.print(trial_state_table(manifest, records))
            if not any(r.active for r in records):
                click.echo(f"all {len(records)} trials ended; finish with: dsorch trial --collect {_shown(target)}")
            return
        _finish_trials(project, reg, target, manifest, pdir, name, wait)
        return
    from orchestrator.spec.model import load_spec

    spec_file, loaded_spec = load_spec(target)
    lp = _load_cluster(project, project.cluster(cluster), pdir)
    proposal = trials.propose(spec_file, lp, top, steps, nodes, gpus_per_node)
    if out is None:
        out = project.root / "trials" / project.default_plan_dir(spec_file.name, lp.profile.name, "deepspeed", nodes,
                                                                 gpus_per_node).name
    _check_path(out, "--out")
    con.print(f"trials of {spec_file.name} on {lp.profile.name} ({proposal.world_size} GPUs), {steps} steps each:")
    con.print(trial_proposal_table(proposal))
    click.echo(trial_cost_text(proposal, steps))
    if dry_run:
        return
    manifest = trials.start(project, target, spec_file, loaded_spec.sha256, lp, proposal, out, steps, top, nodes,
                            gpus_per_node, pdir)
    ids = ", ".join(t.job_id for t in manifest.trials)
    click.echo(f"submitted {len(manifest.trials)} trials as one job array ({manifest.executor}): {ids}; "
               f"trial directory {_shown(out)}")
    if not wait:
        click.echo(f"  progress: dsorch trial --status {_shown(out)}    when done: dsorch trial --collect {_shown(out)}")
        return
    _finish_trials(project, reg, out, manifest, pdir, name, wait=True)


def _finish_trials(project, reg, trial_dir: Path, manifest, profiles_dir, name, wait: bool) -> None:
    from orchestrator.run import trial as trials
    from orchestrator.cli.console import trial_results_table, trial_summary

    records = _wait_trials(reg, manifest) if wait else trials.states(reg, manifest)
    active = [r for r in records if r.active]
    if active:
        raise UserError(f"{len(active)} of {len(records)} trials in {_shown(trial_dir)} are still queued or running "
                        f"({', '.join(r.job_id for r in active)}); pass --wait, or see `dsorch trial --status "
                        f"{_shown(trial_dir)}`.")
    results = trials.results_of(Path(trial_dir), manifest, records)
    con = _console()
    con.print(trial_results_table(results))
    collected = trials.collect(project, Path(trial_dir), results, manifest, profiles_dir, name)
    click.echo(trial_summary(collected, _shown))


def _progress_printer(con, spinner):
    """Progress on stderr: the spinner's text on a terminal, else a line whenever the text changes."""
    last = None

    def show(text: str) -> None:
        nonlocal last
        if con.is_terminal:
            spinner.update(text)
        elif text != last:
            click.echo(text, err=True)
        last = text

    return show


def _wait_trials(reg, manifest):
    """Poll until every trial ended; progress on stderr (a spinner on a terminal, else a line per change)."""
    import time

    from orchestrator.run import trial as trials

    con = _console(stderr=True)

    def line(records) -> str:
        running = sum(r.state == "RUNNING" for r in records)
        done = [r for r in records if not r.active]
        failed = sum(r.state != "COMPLETED" for r in done)
        now = next((f"; {t.dir} at step {r.last_step or 0}/{manifest.steps}" for t, r in zip(manifest.trials, records)
                    if r.state == "RUNNING"), "")
        return (f"trials: {len(records) - running - len(done)} queued, {running} running, {len(done)} done"
                + (f" ({failed} failed)" if failed else "") + now)

    with con.status("trials: submitted") as spinner:
        show = _progress_printer(con, spinner)
        while True:
            records = trials.states(reg, manifest)
            show(line(records))
            if not any(r.active for r in records):
                return records
            time.sleep(2)


# --------------------------------------------------------------------------------------------
# doctor
# --------------------------------------------------------------------------------------------


@main.command(epilog="""\b
Examples:
  dsorch doctor --cluster dgx16 --nodes 2          # two nodes are enough to see the fabric
  dsorch doctor --cluster dgx16 --nodes 2 --write  # store the figures in profiles/dgx16-doctor.yaml
""")
@click.option("--cluster", "-c", default=None, metavar="NAME", shell_complete=_complete_cluster,
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
@_profiles_dir_option
def doctor(cluster, nodes, max_size, iters, timeout, write, name, profiles_dir):
    """Check that every rank reaches every other and measure all-reduce / all-gather bus bandwidth
    inside and across nodes (nccl-tests style), against the profile's figures. Submits one short
    job (SLURM, or this machine with a local profile) and waits for it."""
    from orchestrator.cli.console import doctor_report
    from orchestrator.run.doctor import expected, healthy, submit_checks, wait_for_checks, write_measured_profile

    project = _project()
    pdir = _profiles_dir(project, profiles_dir)
    lp = _load_cluster(project, project.cluster(cluster), pdir)
    sub = submit_checks(project.root, lp.profile, nodes=nodes, max_size_mib=max_size, iters=iters,
                        timeout_min=timeout)
    profile = sub.profile
    click.echo(f"submitted doctor job {sub.job_id} ({profile.world_size} ranks on {profile.nodes} node(s) of "
               f"{profile.name}); files in {_shown(sub.folder)}", err=True)
    con = _console(stderr=True)
    with con.status(f"doctor job {sub.job_id}: PENDING") as spinner:
        show = _progress_printer(con, spinner)
        data = wait_for_checks(sub, lambda state: show(f"doctor job {sub.job_id}: {state}"), _shown(sub.folder))
    _console().print(doctor_report(data, profile, expected(profile)))
    if write:
        path = write_measured_profile(project, pdir, lp.profile, data, sub.job_id, name)
        click.echo(f"wrote {_shown(path)}: plan with --cluster {path.stem}")
    if not healthy(data):
        sys.exit(1)


# --------------------------------------------------------------------------------------------
# calibrate
# --------------------------------------------------------------------------------------------


@main.command(epilog="""\b
Examples:
  dsorch calibrate runs/tiny-1 --cluster local --out my-local.yaml
  dsorch calibrate measured.jsonl --cluster dgx16 --name dgx16-calibrated --out profiles/dgx16-calibrated.yaml
""")
@click.argument("metrics", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--cluster", "-c", default=None, metavar="NAME", shell_complete=_complete_cluster,
              help="Profile whose efficiencies to fit; default $DSORCH_CLUSTER, then cluster in dsorch.yaml.")
@click.option("--plan", "plan_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Plan directory the runs used (default: found next to each metrics.jsonl).")
@click.option("--name", default=None, help="Name of the calibrated profile (default: NAME-calibrated).")
@click.option("--out", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the calibrated profile here (default: print it).")
@click.option("--json", "as_json", is_flag=True, help="Print the fit report as JSON.")
@_profiles_dir_option
def calibrate(metrics, cluster, plan_dir, name, out, as_json, profiles_dir):
    """Fit a profile's efficiencies to measured step times and write a calibrated profile.

    METRICS are run directories or metrics.jsonl files written by the training entrypoint, or
    record files (YAML/JSONL of {layout, model, step_time_s, peak_mem_gib}; see
    orchestrator/calibrate/__init__.py).
    """
    from orchestrator.calibrate import calibrate as fit
    from orchestrator.calibrate import calibrated_profile_yaml

    project = _project()
    lp = _load_cluster(project, project.cluster(cluster), _profiles_dir(project, profiles_dir))
    calibrated, report = fit(list(metrics), lp.profile, plan_dir=plan_dir)
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
