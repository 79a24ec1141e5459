"""What every command shares: the error type of the CLI edge, the experiment directory and its
cluster profile, paths as the user typed them, the pin options, the one polling loop."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import click

from orchestrator.errors import DsorchError
from orchestrator.plan.layout import PINNABLE, Pins

EPILOG = """\b
Typical use:
  dsorch init --cluster dgx16                  # dsorch.yaml: default cluster, profiles, plans and runs dirs
  dsorch plan examples/llama3-70b.yaml         # writes plans/llama3-70b-dgx16/ (--out DIR to choose)
  dsorch plan examples/llama3-70b.yaml --check # exit 1 with a diff if the committed plan is stale
  dsorch plan --check plans/*/                 # every committed plan, each from the inputs it recorded
  dsorch submit --cluster dgx16                # the plan for dgx16 in plans/; --dry-run prints the sbatch script
  dsorch status; dsorch logs JOB --follow; dsorch cancel JOB
  dsorch plan examples/tiny.yaml --cluster local && dsorch submit --cluster local --wait
  dsorch profiles; dsorch validate plans/llama3-70b-dgx16; dsorch calibrate runs/... --cluster NAME
"""


T = TypeVar("T")


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
            kind = click.Choice(a.choices) if a.choices else click.IntRange(a.low, a.high) if a.kind is int else None
            with_pins = click.option(a.flag, a.name, type=kind, default=None, help=a.help)(with_pins)
        return with_pins

    return decorate


class UserError(click.ClickException):
    """A DsorchError at the CLI edge: message only, no traceback, exit code 2."""

    exit_code = 2

    def format_message(self) -> str:
        return self.message


def user_error(e: DsorchError) -> UserError:
    return UserError(str(e))


def make_console(stderr: bool = False):
    from rich.console import Console

    # Wide enough for the layout table when piped into a file or CI log.
    return Console(stderr=stderr, width=None if sys.stdout.isatty() else 140, highlight=False)


# Shared by every command that resolves a cluster profile.
def cluster_option(help: str):
    """--cluster/-c: a profile name, completed from the profiles this experiment directory sees;
    ``help`` says what the command does with it."""
    return click.option("--cluster", "-c", default=None, metavar="NAME", shell_complete=complete_cluster, help=help)


profiles_dir_option = click.option(
    "--profiles-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory of your own cluster profiles (NAME.yaml); default $DSORCH_PROFILES_DIR, then profiles_dir "
    "in dsorch.yaml. A profile there wins over a shipped one of the same name.",
)


def complete_cluster(ctx, param, incomplete: str) -> list[str]:
    """Shell completion of --cluster: the profiles this experiment directory sees."""
    try:
        from orchestrator.spec.cluster import discover_profiles

        project = cwd_project()
        names = discover_profiles(resolve_profiles_dir(project, ctx.params.get("profiles_dir")))
    except Exception:  # completion must never print a traceback into the shell
        return []
    return [n for n in sorted(names) if n.startswith(incomplete)]


def cwd_project():
    from orchestrator.cli.project import load_project

    return load_project(Path.cwd())


def resolve_profiles_dir(project, flag: str | None) -> str | None:
    """The profiles directory to use; one that does not exist is an error naming where it came from."""
    setting = project.profiles_dir(flag)
    if setting.value is not None and not Path(setting.value).is_dir():
        raise DsorchError(
            f"profiles directory {setting.describe()} does not exist; create it, or point "
            f"--profiles-dir, $DSORCH_PROFILES_DIR or profiles_dir in dsorch.yaml at an existing one."
        )
    return setting.value


def load_cluster(project, cluster, profiles_dir: str | None):
    """The profile a resolved cluster setting names; an error says where a defaulted name came from."""
    from orchestrator.spec.cluster import load_profile

    if cluster.value is None:
        raise DsorchError(
            f"no cluster given ({cluster.origin}). Pass --cluster NAME (see `dsorch profiles`), set "
            f"$DSORCH_CLUSTER, or write a default with `dsorch init --cluster NAME`."
        )
    try:
        return load_profile(cluster.value, profiles_dir)
    except DsorchError as e:
        if cluster.origin == "--cluster":
            raise
        raise type(e)(f"cluster {cluster.describe()}: {e}") from None


def check_out_path(p: Path, flag: str) -> None:
    """A path the filesystem can hold: each name at most 255 bytes, 4096 in all, 256 levels deep."""
    text = os.fsencode(str(p))
    if len(text) > 4096 or len(p.parts) > 256 or any(len(os.fsencode(part)) > 255 for part in p.parts):
        raise UserError(
            f"{flag}: the path is too long or too deep for a filesystem (names of at most 255 bytes, "
            f"4096 in all); choose a shorter one."
        )


def display_path(p: Path) -> str:
    """A path as the user should read it: relative to the working directory when below it."""
    try:
        return Path(os.path.relpath(os.path.abspath(p))).as_posix()
    except ValueError:
        return str(p)


def ds_env() -> None:
    # DeepSpeed picks an accelerator at import; on a CPU-only login node that is the CPU one, and
    # saying so up front silences its warning. Validation needs no accelerator either way.
    os.environ.setdefault("DS_ACCELERATOR", "cpu")


def open_registry():
    """The job registry of the experiment directory (where dsorch.yaml is, else the working directory)."""
    from orchestrator.run.registry import Registry

    return Registry(cwd_project().root)


def tail_lines(text: str, n: int) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])


def poll(read: Callable[[], T], every_s: float) -> Iterator[T]:
    """The one polling loop of the CLI: ``read()`` now, then every ``every_s`` seconds, until the
    caller stops iterating (the job ended, a deadline passed)."""
    while True:
        yield read()
        time.sleep(every_s)


@contextlib.contextmanager
def status_line(first: str) -> Iterator[Callable[[str], None]]:
    """Progress on stderr while a command waits: a spinner on a terminal, else a line per change
    (a CI log keeps every state once). Yields the function that shows the next text."""
    con = make_console(stderr=True)
    last: list[str | None] = [None]
    with con.status(first) as spinner:

        def show(text: str) -> None:
            if con.is_terminal:
                spinner.update(text)
            elif text != last[0]:
                click.echo(text, err=True)
            last[0] = text

        yield show
