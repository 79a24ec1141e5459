"""`dsorch init`, `profiles`, `import-hf`, `completion`: an experiment directory, its profiles and specs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from orchestrator.cli.common import (
    UserError,
    check_out_path,
    cluster_option,
    cwd_project,
    display_path,
    make_console,
    profiles_dir_option,
    resolve_profiles_dir,
)
from orchestrator.errors import DsorchError

if TYPE_CHECKING:
    from orchestrator.spec.model import ModelSpec


@click.command(
    epilog="""\b
Examples:
  dsorch completion bash > ~/.dsorch-complete.bash && echo '. ~/.dsorch-complete.bash' >> ~/.bashrc
  dsorch completion zsh > ~/.dsorch-complete.zsh   # then source it from ~/.zshrc
  dsorch completion fish > ~/.config/fish/completions/dsorch.fish
"""
)
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell):
    """Print the shell completion script for dsorch (click's shell completion: commands, options,
    choices and paths)."""
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    root = click.get_current_context().find_root().command  # the dsorch group, whose commands it completes
    click.echo(cls(root, {}, "dsorch", "_DSORCH_COMPLETE").source())


@click.command(
    "import-hf",
    epilog="""\b
Examples:
  dsorch import-hf Meta-Llama-3-8B/config.json --out specs/llama3-8b.yaml
  dsorch import-hf config.json --seq-length 4096 --global-batch-size 1024 --name qwen2-7b
  dsorch import-hf DeepSeek-V3/config.json --seq-length 4096 --train-tokens 14.8e12 --out specs/dsv3.yaml
""",
)
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--out",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Spec file to write; default: print it.",
)
@click.option("--name", default=None, help="The spec's name; default the config's _name_or_path, else its folder.")
@click.option(
    "--seq-length",
    type=click.IntRange(1, 100_000_000),
    default=None,
    help="training.seq_length; default max_position_embeddings, at most 8192.",
)
@click.option(
    "--global-batch-size",
    type=click.IntRange(1, 100_000_000),
    default=None,
    help="training.global_batch_size in sequences; default about 4M tokens per step.",
)
@click.option(
    "--train-tokens",
    type=click.FloatRange(1, None),
    default=None,
    help="training.train_tokens, the training length (the megatron runtime needs one); default: none.",
)
@click.option("--force", is_flag=True, help="Overwrite an existing --out file.")
def import_hf(config, out, name, seq_length, global_batch_size, train_tokens, force):
    """Make a model spec from a Hugging Face config.json (Llama, Mistral, Mixtral, Qwen2, Qwen2-MoE,
    Qwen3, Qwen3-MoE, DeepSeek-V3, GPT-OSS, Gemma, GPT-NeoX, GPT-2, Falcon), offline, and say its
    total and active parameters. What the spec cannot express (chunked attention, Mamba layers, an
    expert setting the family's import does not map, ...) is refused with the key; what changes only
    the numerics (RoPE scaling, ...) is said and noted in the spec's source."""
    import yaml
    from pydantic import ValidationError

    from orchestrator.plandir.writer import write_text_atomic
    from orchestrator.spec.hf_import import import_config, spec_document
    from orchestrator.spec.model import SpecFile

    if out is not None:
        check_out_path(out, "--out")
        if out.exists() and not force:
            raise UserError(f"--out {out} exists; pass --force to overwrite it, or choose another path.")
    imp = import_config(config, name)
    doc = spec_document(
        imp, f"Hugging Face config.json ({imp.family}), imported by dsorch import-hf", seq_length, global_batch_size
    )
    if train_tokens is not None:
        doc["training"]["train_tokens"] = train_tokens
    try:
        spec = SpecFile.model_validate(doc)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()[:5])
        # The message names pydantic's first problems; its traceback would only repeat them.
        raise UserError(
            f"{config}: the imported spec is not valid: {problems}. Fix it with --seq-length / "
            f"--global-batch-size, or write the spec by hand."
        ) from None
    text = (
        "# Imported from a Hugging Face config.json by `dsorch import-hf`. The model section is the\n"
        "# config's; the training section is a starting point: set the sequence, batch and length you train.\n"
        + yaml.safe_dump(doc, sort_keys=False, width=100)
    )
    for note in imp.notes:
        click.echo(f"note: not carried: {note}.", err=True)
    head, *details = _import_summary(imp.family, spec.model)
    if out is None:
        click.echo(text, nl=False)
        # On stderr, so that the spec on stdout stays a file to redirect.
        for line in (f"imported: {head}", *details):
            click.echo(line, err=True)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, text)
    click.echo(f"wrote {display_path(out)}: {head}")
    for line in details:
        click.echo(line)
    click.echo(f"next: dsorch plan {display_path(out)}")


def _size(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n:,}"


def _import_summary(family: str, m: ModelSpec) -> list[str]:
    """What import-hf made, in the counts model cards publish: the total, and for a mixture of
    experts the parameters one token passes through (with and without the input embedding, the two
    conventions model cards use), the experts, and the multi-token-prediction modules apart."""
    lines = [f"{family}, {m.num_layers} layers, hidden {m.hidden_size}"]
    if m.moe is None:
        lines.append(f"  parameters: {_size(m.num_params)}")
    else:
        e = m.moe
        lines.append(
            f"  parameters: {_size(m.num_params)} total, {_size(m.active_params)} active per token "
            f"({_size(m.active_params - m.embedding_params)} without the input embedding)"
        )
        shared = f" + {e.shared_experts} shared" if e.shared_experts else ""
        lines.append(
            f"  experts: {e.num_experts} routed, top {e.top_k}{shared}, of {e.ffn_hidden_size} each, "
            f"on {m.num_moe_layers} of {m.num_layers} layers"
        )
    if m.mtp_layers:
        lines.append(
            f"  multi-token prediction: {m.mtp_layers} module{'s' if m.mtp_layers != 1 else ''}, "
            f"{_size(m.mtp_params)} beside the main model (embedding and output head shared)"
        )
    return lines


@click.command()
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@profiles_dir_option
def profiles(name, as_json, profiles_dir):
    """List cluster profiles, or show one (NAME) with `extends` resolved."""
    import yaml

    from orchestrator.spec.cluster import discover_profiles, load_profile

    pdir = resolve_profiles_dir(cwd_project(), profiles_dir)
    if name:
        lp = load_profile(name, pdir)
        doc = {
            "source": {"origin": lp.source.origin, "path": str(lp.source.path)},
            **lp.profile.model_dump(mode="json"),
            # left out of the dump on purpose (plan.yaml), shown here where it was written
            **({"login": lp.profile.login.model_dump(mode="json")} if lp.profile.login else {}),
        }
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
            rows.append(
                {
                    "name": pname,
                    "origin": src.origin,
                    "path": str(src.path),
                    "nodes": None,
                    "gpus_per_node": None,
                    "gpu": None,
                    "gpu_memory_gib": None,
                    "description": f"INVALID: {' '.join(str(e).split())}",
                }
            )
            continue
        rows.append(
            {
                "name": pname,
                "origin": src.origin,
                "path": str(src.path),
                "nodes": p.nodes,
                "gpus_per_node": p.gpus_per_node,
                "gpu": p.gpu.name,
                "gpu_memory_gib": p.gpu.memory_gib,
                "description": p.description,
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    from orchestrator.cli.console import profile_table

    make_console().print(profile_table(rows))


@click.command(
    epilog="""\b
Examples:
  dsorch init --cluster dgx16                       # in your experiment repository
  dsorch init --cluster mycluster --profiles-dir profiles   # your own profile in profiles/mycluster.yaml
"""
)
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path), default=".")
@cluster_option(
    "Default cluster profile of this repository.",
)
@click.option(
    "--profiles-dir", default=None, metavar="DIR", help="Directory of your own cluster profiles, relative to DIRECTORY."
)
@click.option(
    "--plans-dir",
    default="plans",
    show_default=True,
    metavar="DIR",
    help="Where `dsorch plan SPEC` writes plan directories, relative to DIRECTORY.",
)
@click.option(
    "--runs-dir",
    default="runs",
    show_default=True,
    metavar="DIR",
    help="Where `dsorch submit` writes checkpoints and metrics, relative to DIRECTORY.",
)
@click.option("--force", is_flag=True, help="Overwrite an existing dsorch.yaml.")
def init(directory, cluster, profiles_dir, plans_dir, runs_dir, force):
    """Write dsorch.yaml for an experiment repository: its default cluster, profiles, plans and runs.

    Every dsorch command run in DIRECTORY or below then uses these defaults (flags and the
    environment override them), and keeps its job registry in DIRECTORY/.dsorch/.
    """
    from orchestrator.cli.project import CONFIG_NAME, merged_ignore, missing_ignore_lines, render_config
    from orchestrator.plandir.writer import write_text_atomic
    from orchestrator.spec.cluster import load_profile

    target = directory / CONFIG_NAME
    for flag, value in (("--profiles-dir", profiles_dir), ("--plans-dir", plans_dir), ("--runs-dir", runs_dir)):
        if value is not None and (Path(value).is_absolute() or ".." in Path(value).parts or "\n" in value):
            raise UserError(
                f"{flag} {value!r}: give a path inside {directory}, relative to it, so the "
                f"repository works wherever it is cloned."
            )
    if target.exists() and not force:
        raise UserError(f"{target} exists; edit it, or pass --force to overwrite it.")
    if profiles_dir is not None and not (directory / profiles_dir).is_dir():
        raise UserError(
            f"--profiles-dir {profiles_dir}: {directory / profiles_dir} is not a directory; create it "
            f"and put your cluster profiles (NAME.yaml) in it first."
        )
    if cluster is not None:
        load_profile(cluster, directory / profiles_dir if profiles_dir else None)
    ignore, old, missing = missing_ignore_lines(directory, plans_dir, runs_dir)
    write_text_atomic(target, render_config(cluster, profiles_dir, plans_dir, runs_dir))
    if missing:
        write_text_atomic(ignore, merged_ignore(old, missing))
    click.echo(
        f"wrote {display_path(target)}"
        + (f": default cluster {cluster}" if cluster else ": no default cluster (add one with `cluster: NAME`)")
    )
    if missing:
        click.echo(f"{'added to' if old else 'wrote'} {display_path(ignore)}: {' '.join(missing)}")
    click.echo(f"  next: dsorch plan SPEC  ->  {plans_dir}/<spec>-<cluster>/;  dsorch submit [--cluster NAME]")
    click.echo(f"  commit dsorch.yaml and {plans_dir}/ (what runs writes there is ignored)")
