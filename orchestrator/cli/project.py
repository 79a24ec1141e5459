"""The experiment repository: its ``dsorch.yaml`` and the defaults it gives every command.

An experiment repository has a small ``dsorch.yaml`` at its root (``dsorch init`` writes it),
found from the working directory upwards as git finds ``.git``. It names the default cluster,
the directory of the team's own cluster profiles, and where plans and runs go. The directory
that holds it is the *experiment directory*: the job registry (``.dsorch/``) lives there, so
``dsorch status`` answers the same from any subdirectory. Without a ``dsorch.yaml`` the working
directory is the experiment directory and every default is the built-in one.

Each setting is resolved in one order, and remembers where its value came from so that an error
can say it: the command-line flag, then the environment (``DSORCH_CLUSTER``,
``DSORCH_PROFILES_DIR``), then ``dsorch.yaml``, then the built-in default (for profiles, a
``profiles/`` directory in the experiment directory when it exists).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.errors import DsorchError, SpecError
from orchestrator.plandir.rundir import METRICS_FILE

if TYPE_CHECKING:
    from orchestrator.runtimes import Runtime

CONFIG_NAME = "dsorch.yaml"
ENV_CLUSTER = "DSORCH_CLUSTER"
ENV_PROFILES_DIR = "DSORCH_PROFILES_DIR"
# The profiles directory when none is configured, if the experiment directory has one.
DEFAULT_PROFILES_DIR = "profiles"
# One alphabet for every name that becomes a directory or reaches a script: letters, digits, '.',
# '_' and '-' (the same one SLURM job names are kept to).
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class ProjectConfig(BaseModel):
    """``dsorch.yaml``. Paths are relative to the file's directory."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster: str | None = Field(
        default=None, min_length=1, max_length=200, description="default --cluster for plan, submit and calibrate"
    )
    profiles_dir: str | None = Field(
        default=None,
        min_length=1,
        description="your cluster profiles (NAME.yaml); a name there wins over a shipped one",
    )
    plans_dir: str = Field(
        default="plans", min_length=1, description="`dsorch plan SPEC` writes PLANS_DIR/<spec>-<cluster>/"
    )
    runs_dir: str = Field(
        default="runs",
        min_length=1,
        description="`dsorch submit` writes checkpoints and metrics to RUNS_DIR/<plan>-<key>/",
    )


@dataclass(frozen=True)
class Setting:
    """A resolved value and where it came from (for messages: '--cluster', '$DSORCH_CLUSTER', ...)."""

    value: str | None
    origin: str

    def describe(self) -> str:
        return f"'{self.value}' (from {self.origin})"


@dataclass(frozen=True)
class Project:
    root: Path  # the experiment directory, absolute
    config_file: Path | None
    config: ProjectConfig
    lines: dict

    def _origin(self, key: str) -> str:
        line = self.lines.get((key,))
        return f"{self.config_file}:{line} ({key})" if line else f"{self.config_file} ({key})"

    def _resolve(
        self, flag: str | None, flag_name: str, env_name: str, key: str, env: Mapping[str, str] | None
    ) -> Setting:
        """flag, then environment, then dsorch.yaml: the one order every default follows."""
        env = os.environ if env is None else env
        if flag:
            return Setting(flag, flag_name)
        if env.get(env_name):
            return Setting(env[env_name], f"${env_name}")
        value = getattr(self.config, key)
        if value:
            # Paths in dsorch.yaml are relative to it.
            return Setting(str(self.root / value) if key.endswith("_dir") else value, self._origin(key))
        where = f"no {key} in {self.config_file}" if self.config_file else f"no {CONFIG_NAME}"
        return Setting(None, f"no {flag_name}, no ${env_name}, {where}")

    def cluster(self, flag: str | None, env: Mapping[str, str] | None = None) -> Setting:
        return self._resolve(flag, "--cluster", ENV_CLUSTER, "cluster", env)

    def profiles_dir(self, flag: str | None, env: Mapping[str, str] | None = None) -> Setting:
        """As every setting, then the built-in default: a ``profiles/`` directory in the experiment
        directory when there is one (where `dsorch trial` writes the profile it calibrates)."""
        setting = self._resolve(flag, "--profiles-dir", ENV_PROFILES_DIR, "profiles_dir", env)
        if setting.value is None and (self.root / DEFAULT_PROFILES_DIR).is_dir():
            return Setting(
                str(self.root / DEFAULT_PROFILES_DIR),
                f"{setting.origin}; the experiment directory's {DEFAULT_PROFILES_DIR}/",
            )
        return setting

    @property
    def plans_dir(self) -> Path:
        return self.root / self.config.plans_dir

    @property
    def runs_dir(self) -> Path:
        return self.root / self.config.runs_dir

    def default_plan_dir(
        self,
        spec_name: str,
        cluster: str,
        runtime: Runtime | str,
        nodes: int | None = None,
        gpus_per_node: int | None = None,
    ) -> Path:
        """PLANS_DIR/<spec>-<cluster>[-<N>n][-<G>g][-<runtime>]: predictable, so `dsorch submit` can
        find it, and a resized or other-runtime plan does not overwrite the full-size one (the
        default runtime's plans carry no runtime in the name)."""
        from orchestrator.runtimes import DEFAULT, runtime_named

        runtime = runtime_named(runtime)
        name = (
            f"{spec_name}-{cluster}"
            + (f"-{nodes}n" if nodes else "")
            + (f"-{gpus_per_node}g" if gpus_per_node else "")
            + ("" if runtime == DEFAULT else f"-{runtime.name}")
        )
        return self.plans_dir / (_UNSAFE.sub("-", name).strip("-.") or "plan")

    def plan_dirs(self) -> list[Path]:
        """Every plan directory directly under PLANS_DIR, sorted."""
        if not self.plans_dir.is_dir():
            return []
        return sorted(p for p in self.plans_dir.iterdir() if (p / "plan.yaml").is_file())


def find_config(start: Path) -> Path | None:
    """The nearest dsorch.yaml in ``start`` or a parent directory, as git looks for .git."""
    here = start.resolve()
    for d in (here, *here.parents):
        f = d / CONFIG_NAME
        if f.is_file():
            return f
    return None


def load_project(start: Path | None = None) -> Project:
    start = Path.cwd() if start is None else start
    f = find_config(start)
    if f is None:
        return Project(start.resolve(), None, ProjectConfig(), {})
    from orchestrator.spec.yamlio import format_validation, load_yaml

    loaded = load_yaml(f, empty_ok=True)  # an empty dsorch.yaml: all defaults
    try:
        config = ProjectConfig.model_validate(loaded.data)
    except ValidationError as e:
        # The message carries every problem pydantic found, with file and line: its traceback adds nothing.
        raise SpecError(format_validation(e, loaded, ProjectConfig, "dsorch config")) from None
    return Project(f.parent, f, config, loaded.lines)


def find_plan(project: Project, cwd: Path, cluster: Setting) -> Path:
    """The plan `dsorch submit` means when it is given no PLAN_DIR: the working directory if it is
    a plan directory, else the one plan in PLANS_DIR for the cluster (or the only plan there).
    Only the default runtime's plans count, so that a Megatron-LM plan beside one (a -megatron plan
    directory) does not make the choice ambiguous; name a Megatron-LM plan as PLAN_DIR."""
    from orchestrator.plandir.reader import load_plan_dir
    from orchestrator.runtimes import DEFAULT

    if (cwd / "plan.yaml").is_file():
        return cwd
    plans: dict[Path, str] = {}  # plan directory -> its cluster
    broken: list[str] = []
    for p in project.plan_dirs():
        try:
            pd = load_plan_dir(p)
        except DsorchError:
            broken.append(_rel(p, cwd))
            continue
        if pd.runtime == DEFAULT:
            plans[p] = pd.doc.cluster.name
    rel = _rel(project.plans_dir, cwd)
    note = f" (not counted, they do not load: {', '.join(broken)}; `dsorch validate` says why)" if broken else ""
    if not plans:
        raise DsorchError(
            f"no PLAN_DIR given and {rel}/ has no plan directory for `dsorch submit` (the {DEFAULT.name} "
            f"runtime){note}; write one with `dsorch plan SPEC"
            + (f" --cluster {cluster.value}" if cluster.value else " --cluster NAME")
            + "` or pass PLAN_DIR."
        )
    if cluster.value is not None:
        matching = [p for p, c in plans.items() if c == cluster.value]
        what = f"for cluster {cluster.describe()}"
    else:
        matching = list(plans)
        what = f"and no cluster to choose by ({cluster.origin})"
    if len(matching) == 1:
        return matching[0]
    if not matching:
        have = ", ".join(f"{_rel(p, cwd)} ({c})" for p, c in plans.items())
        raise DsorchError(
            f"no PLAN_DIR given and no plan in {rel}/ {what}; plans there: {have}{note}. Plan one with "
            f"`dsorch plan SPEC --cluster {cluster.value}`, or pass PLAN_DIR."
        )
    listing = "\n  ".join(f"{_rel(p, cwd)} (cluster {plans[p]})" for p in matching)
    raise DsorchError(f"no PLAN_DIR given and {len(matching)} plans in {rel}/ {what}; say which:\n  {listing}")


def _rel(p: Path, base: Path) -> str:
    try:
        return os.path.relpath(p, base)
    except ValueError:
        return str(p)


CONFIG_TEMPLATE = """\
# dsorch experiment configuration (written by `dsorch init`); commit it with your plans.
# Every dsorch command run in this directory or below reads it. A flag or the environment
# ($DSORCH_CLUSTER, $DSORCH_PROFILES_DIR) overrides a value here.

# Default --cluster: a shipped profile (`dsorch profiles`) or one of yours in profiles_dir.
cluster: {cluster}

# Your own cluster profiles, NAME.yaml; a name here wins over a shipped profile.
profiles_dir: {profiles_dir}

# `dsorch plan SPEC` writes {plans_dir}/<spec>-<cluster>/ ; `dsorch submit` finds plans there.
plans_dir: {plans_dir}

# `dsorch submit` writes checkpoints and {metrics_file} to {runs_dir}/<plan>-<job key>/.
runs_dir: {runs_dir}
"""


def ignore_lines(plans_dir: str, runs_dir: str) -> list[str]:
    """What an experiment repository should not commit: the job registry, run directories, and
    what a plain `sbatch job.sbatch` writes inside a plan directory (checkpoints, its log)."""
    p = plans_dir.rstrip("/")
    return [".dsorch/", f"/{runs_dir.rstrip('/')}/", f"/{p}/*/run/", f"/{p}/*/checkpoints/", f"/{p}/*/slurm-*.out"]


def missing_ignore_lines(directory: Path, plans_dir: str, runs_dir: str) -> tuple[Path, str, list[str]]:
    """The repository's .gitignore, its text now ("" where there is none) and the lines of
    ``ignore_lines`` it lacks."""
    ignore = directory / ".gitignore"
    old = ignore.read_text(encoding="utf-8", errors="replace") if ignore.is_file() else ""
    return ignore, old, [line for line in ignore_lines(plans_dir, runs_dir) if line not in old.splitlines()]


def merged_ignore(old: str, missing: list[str]) -> str:
    """The .gitignore with dsorch's lines added under a comment of their own, the user's untouched."""
    sep = "" if not old or old.endswith("\n") else "\n"
    return old + sep + "\n".join(["# dsorch: job registry, checkpoints, logs", *missing]) + "\n"


def render_config(cluster: str | None, profiles_dir: str | None, plans_dir: str, runs_dir: str) -> str:
    def scalar(v: str | None) -> str:
        return "null" if v is None else yaml.safe_dump(v, default_style=None).strip().removesuffix("\n...")

    return CONFIG_TEMPLATE.format(
        cluster=scalar(cluster),
        profiles_dir=scalar(profiles_dir),
        plans_dir=scalar(plans_dir),
        runs_dir=scalar(runs_dir),
        metrics_file=METRICS_FILE,
    )
