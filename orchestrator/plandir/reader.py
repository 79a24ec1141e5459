"""The plan directory as every reader sees it: one schema for plan.yaml, one loader.

`dsorch plan` writes the directory (orchestrator.plandir.writer); `dsorch validate`, `dsorch submit`, the
training entrypoint and `dsorch calibrate` read it through ``load_plan_dir`` and nothing else.

plan.yaml carries the model spec as planned (``spec``) and the sha256 of every other file it was
written with (``files``). The loader checks those hashes, so a file edited after dsorch wrote it
is refused with the name of the file, not half-applied; the spec is validated again with the
same pydantic model the planner uses, so readers get a ``SpecFile`` and a ``Layout``, never
flags to re-parse.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.costmodel.stacks import MEMORY_KEYS, TIME_PARTS
from orchestrator.errors import InvalidFile
from orchestrator.plan.layout import (
    WORLD_PRODUCT,
    Layout,
    LayoutDoc,
    layout_schema,
    world_of,
)
from orchestrator.runtimes import RUNTIME_NAMES, Runtime, runtime_named
from orchestrator.spec.cluster import ProfileExecutor
from orchestrator.spec.model import SpecFile

PLAN_FILE = "plan.yaml"
# Every file `dsorch plan` may write, plan.yaml last (it records the others' hashes).
GENERATED = ("ds_config.json", "job.sbatch", "launch.sh", "megatron_args.txt", "plan.md", PLAN_FILE)
# Generated files are small (a 405B plan.yaml is ~40 KB); a larger one is not ours.
MAX_FILE_BYTES = 16 << 20

_DOC = ConfigDict(extra="forbid", frozen=True)


class _Digest(BaseModel):
    model_config = _DOC
    # model_spec: the spec's path, relative to the plan directory.
    path: str | None = None
    # cluster_profile: the profile's name.
    name: str | None = None
    # cluster_profile: where it was found, shipped or user (a --profiles-dir).
    origin: str | None = None
    # sha256 of the file (of a profile that extends others, of its files' hashes in order).
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class PlanInputs(BaseModel):
    model_config = _DOC
    # The model spec file planned from.
    model_spec: _Digest
    # The cluster profile planned for.
    cluster_profile: _Digest
    # Nodes planned for: the profile's, or --nodes.
    nodes: int = Field(gt=0)
    # --nodes was given: a re-plan keeps the count rather than follow the profile (compose.replan).
    # Plans written before it was recorded lack the key (compose.Recorded.given_nodes).
    nodes_given: bool | None = None
    # --gpus-per-node where it was given; absent otherwise.
    gpus_per_node: int | None = Field(default=None, gt=0)
    # Layout axes pinned on the command line (--tp 8, ...): axis name to value.
    pinned: dict[str, Any] = {}
    memory_margin_gib: float = Field(ge=0)
    # The margin was the default one, derived from the memory model's error (plans written before
    # it had a default of 0 lack the key and were given theirs).
    memory_margin_derived: bool = False


class PlanModel(BaseModel):
    model_config = _DOC
    # The spec's name.
    name: str
    # Parameters of the main model (the MTP modules apart).
    params: int = Field(gt=0)
    # params in billions, rounded to 3 decimals.
    params_billion: float
    active_params: int | None = Field(default=None, gt=0)  # a mixture of experts: per token
    mtp_params: int | None = Field(default=None, gt=0)  # the MTP modules beside the main model
    # training.seq_length, tokens per sequence.
    seq_length: int = Field(gt=0)
    # training.global_batch_size, sequences per optimizer step.
    global_batch_size: int = Field(gt=0)
    # training.precision.
    precision: Literal["bf16", "fp16", "fp32"]


class PlanCluster(BaseModel):
    model_config = _DOC
    # The cluster profile's name.
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    # Nodes planned for (--nodes applied).
    nodes: int = Field(gt=0, le=1_000_000)
    # GPUs per node planned for (--gpus-per-node applied).
    gpus_per_node: int = Field(gt=0, le=1024)
    # GPUs in all: nodes x gpus_per_node.
    world_size: int = Field(gt=0)
    # The profile's gpu.name.
    gpu: str
    gpu_memory_gib: float = Field(gt=0)
    # Dense peak TFLOP/s per GPU at the training precision: the denominator of MFU.
    peak_tflops: float = Field(gt=0)
    # The profile's torch.distributed backend.
    backend: Literal["nccl", "gloo"]
    # The profile's executor: slurm or local.
    executor: ProfileExecutor = "slurm"


# plan.yaml's layout section: every axis of orchestrator.plan.layout.AXES.
if TYPE_CHECKING:
    PlanLayout = LayoutDoc
else:
    PlanLayout = layout_schema("PlanLayout", record=False)


class ScoredDoc(BaseModel):
    """A ranked layout with its stacks (``render.report.scored_doc``): the chosen one is plan.yaml's top
    level, the others its ``alternatives``; plan.yaml states the stacks there and nowhere else."""

    model_config = _DOC
    # The layout: parallel degrees, ZeRO stage, micro-batch, recomputation.
    layout: PlanLayout
    memory_gib_per_gpu: dict[str, float]  # keyed by costmodel.stacks.MEMORY_KEYS
    predicted: dict[str, float | str | None]  # numbers, and the interval's basis in words
    time_breakdown_s: dict[str, float]  # keyed by costmodel.stacks.TIME_PARTS


class PlanDoc(BaseModel):
    """plan.yaml. The report sections (memory, predictions, alternatives, explain) are for people;
    readers use the typed ones."""

    model_config = _DOC
    # The dsorch version that wrote the plan.
    dsorch_version: str
    # The training runtime the files are for (`dsorch plan --runtime`).
    runtime: Literal[RUNTIME_NAMES]  # type: ignore[valid-type]
    # What the plan was made from: the input files and their hashes, node count, pins, memory margin.
    inputs: PlanInputs
    # The model spec as planned, whole: what the entrypoint and `dsorch calibrate` read back.
    spec: SpecFile
    profile: dict[str, Any] | None = None  # the cluster profile as planned (older plans lack it)
    # sha256 of each other generated file, by file name; every reader checks them.
    files: dict[str, str]
    # The model in brief: parameters, sequence length, batch, precision.
    model: PlanModel
    # The cluster as planned (--nodes and --gpus-per-node applied).
    cluster: PlanCluster
    # The chosen layout: parallel degrees, ZeRO stage, micro-batch, recomputation.
    layout: PlanLayout
    # The chosen layout's predicted memory per GPU (on the binding pipeline stage), GiB, by part
    # (costmodel.stacks.MEMORY_KEYS: params, grads, optimizer, activations, comm_buffers, framework, total).
    memory_gib_per_gpu: dict[str, float]
    predicted: dict[str, float | str | None]  # numbers, and the interval's basis in words
    time_breakdown_s: dict[str, float]
    # The search in numbers: layouts evaluated, how many fit, how many were rejected by memory, and the
    # rules that ruled layouts out, with counts.
    search: dict[str, Any]
    # The other ranked layouts, best first, each with its stacks (`dsorch plan --top` sets how many).
    alternatives: list[ScoredDoc]
    # For people: the efficiencies used and where each came from, the model's step-time error, the ranking,
    # the closest layouts rejected by memory, the rules that ruled layouts out, the close call, notes.
    explain: dict[str, Any]
    evidence: dict[str, Any] | None = None  # `dsorch trial`: the measurements behind the choice


@dataclass(frozen=True)
class PlanDir:
    path: Path
    doc: PlanDoc
    texts: dict[str, str]  # every generated file but plan.yaml, as written
    changed: tuple[str, ...] = ()  # files whose sha256 differs from plan.yaml's (only with strict=False)

    @property
    def spec(self) -> SpecFile:
        return self.doc.spec

    @property
    def runtime(self) -> Runtime:
        return runtime_named(self.doc.runtime)

    @property
    def layout(self) -> Layout:
        return Layout(**self.doc.layout.model_dump())

    @property
    def ranked(self) -> list[ScoredDoc]:
        """The ranked layouts with their stacks, the chosen one first (the order of ``explain.layouts``)."""
        d = self.doc
        chosen = ScoredDoc(
            layout=d.layout,
            memory_gib_per_gpu=d.memory_gib_per_gpu,
            predicted=d.predicted,
            time_breakdown_s=d.time_breakdown_s,
        )
        # A plan.yaml written before each stack was stated once has 'overhead' in place of comm_buffers
        # and framework (those were in explain.layouts only): it still loads for every other reader.
        missing = [k for k in MEMORY_KEYS if k not in d.memory_gib_per_gpu]
        missing += [k for k in TIME_PARTS if k not in d.time_breakdown_s]
        if missing:
            raise InvalidFile(
                f"{self.path / PLAN_FILE}: its stacks have no {', '.join(missing)} (an older dsorch wrote "
                f"it); regenerate it with the command in its first lines."
            )
        return [chosen, *d.alternatives]

    @property
    def checkpoint_interval(self) -> int:
        """The plan's checkpoint interval in steps: what `dsorch plan` chose (render/notes.py, the same
        number as job.sbatch's --save-interval), read from plan.yaml's explain.notes.checkpoint; 0 for a
        plan written before dsorch chose one (checkpoints then come only at the end and when stopped)."""
        value = self.doc.explain.get("notes", {}).get("checkpoint", {}).get("interval_steps")
        return value if isinstance(value, int) and value > 0 else 0

    @property
    def ds_config(self) -> dict | None:
        text = self.texts.get("ds_config.json")
        return None if text is None else json.loads(text)

    @property
    def megatron_args(self) -> str:
        return self.texts["megatron_args.txt"]


def predicted_step_s(plan_dir: Path, predicted: dict[str, float | str | None]) -> float:
    """The step time of a plan.yaml ``predicted`` section (the chosen layout's or an alternative's).
    The section mixes numbers with the interval's basis in words, so its type cannot say that this
    entry is a number; dsorch always writes one, and a hand-edited plan.yaml without it is refused."""
    value = predicted.get("step_time_s")
    if not isinstance(value, int | float):
        raise InvalidFile(f"{plan_dir}/plan.yaml: predicted.step_time_s is empty; regenerate it with `dsorch plan`.")
    return float(value)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_text(path: Path, what: str = "file") -> str:
    """A generated file's text, with the errors a damaged directory gives turned into one line."""
    try:
        if not path.is_file():
            raise InvalidFile(f"{path}: not a regular file; regenerate the plan directory with `dsorch plan`.")
        if path.stat().st_size > MAX_FILE_BYTES:
            raise InvalidFile(
                f"{path}: {path.stat().st_size:,} bytes is too large for a dsorch {what}; regenerate it "
                f"with `dsorch plan`."
            )
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InvalidFile(f"{path}: not UTF-8 text (byte {e.start}); regenerate it with `dsorch plan`.") from e
    except OSError as e:
        raise InvalidFile(f"{path}: cannot be read ({e.strerror or e}).") from e


def _fmt_errors(e: ValidationError, path: Path) -> str:
    parts = []
    for err in e.errors()[:8]:
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        parts.append(f"{key}: {err['msg']}")
    more = f" (and {len(e.errors()) - 8} more)" if len(e.errors()) > 8 else ""
    return f"{path}: not a plan.yaml of this dsorch ({'; '.join(parts)}{more}); regenerate it with `dsorch plan`."


def changed_message(f: Path) -> str:
    return (
        f"{f} was changed after dsorch wrote it (its sha256 differs from the one plan.yaml records); change "
        f"the model spec or the profile and re-plan, instead of editing the generated files. The command is "
        f"in the first lines of plan.yaml."
    )


def load_plan_dir(path: str | Path, *, strict: bool = True) -> PlanDir:
    """Read and check a plan directory: plan.yaml against its schema, every other file against
    the sha256 plan.yaml recorded, and the facts two sections state twice against each other.
    ``strict=False`` (for ``dsorch validate``, which then says what is wrong with an edited file)
    records changed files in ``PlanDir.changed`` instead of refusing them."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InvalidFile(f"{path} is a file, not a plan directory; pass the directory `dsorch plan` wrote.")
    if not path.is_dir():
        raise InvalidFile(
            f"plan directory {path} does not exist; write one with `dsorch plan SPEC --cluster NAME --out {path}`."
        )
    plan_file = path / PLAN_FILE
    if not plan_file.exists():
        raise InvalidFile(
            f"{path} has no plan.yaml file, so it is not a plan directory; write one with `dsorch plan "
            f"SPEC --cluster NAME --out {path}`."
        )
    doc = _parse(read_text(plan_file, "plan.yaml"), plan_file)
    texts: dict[str, str] = {}
    changed: list[str] = []
    for name, digest in sorted(doc.files.items()):
        if name not in GENERATED or name == PLAN_FILE:
            raise InvalidFile(f"{plan_file}: files lists {name!r}, which dsorch does not write; regenerate the plan.")
        f = path / name
        if not f.exists():
            raise InvalidFile(
                f"{f} is missing; regenerate the plan directory with `dsorch plan` (the command is in "
                f"the first lines of plan.yaml)."
            )
        texts[name] = read_text(f)
        if sha256_text(texts[name]) != digest:
            if strict:
                raise InvalidFile(changed_message(f))
            changed.append(name)
    missing = sorted(set(runtime_named(doc.runtime).renders) - set(texts))
    if missing:
        raise InvalidFile(f"{plan_file}: records no hash for {', '.join(missing)}; regenerate the plan.")
    _check_consistent(doc, plan_file)
    return PlanDir(path, doc, texts, tuple(changed))


def _parse(text: str, plan_file: Path) -> PlanDoc:
    """plan.yaml's text against its schema."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise InvalidFile(
            f"{plan_file}: not valid YAML ({' '.join(str(e).split())[:300]}); regenerate it with `dsorch plan`."
        ) from e
    except (ValueError, RecursionError) as e:
        raise InvalidFile(f"{plan_file}: a value cannot be read ({e}); regenerate it with `dsorch plan`.") from e
    if not isinstance(raw, dict):
        raise InvalidFile(
            f"{plan_file}: not a dsorch plan (no mapping at the top level); regenerate it with `dsorch plan`."
        )
    try:
        return PlanDoc.model_validate(raw)
    except ValidationError as e:
        raise InvalidFile(_fmt_errors(e, plan_file)) from e


def plan_dir_of(path: str | Path, files: dict[str, str]) -> PlanDir:
    """The plan directory that ``files`` (just generated, not written) would make at ``path``: what
    `plan --check` draws the pictures of, to compare them with those in ``path``/plots/."""
    path = Path(path)
    return PlanDir(
        path,
        _parse(files[PLAN_FILE], path / PLAN_FILE),
        {name: text for name, text in files.items() if name != PLAN_FILE},
    )


def _check_consistent(doc: PlanDoc, plan_file: Path) -> None:
    L, c, t = doc.layout, doc.cluster, doc.spec.training
    problems = []
    world = world_of(L.model_dump())
    if world != c.world_size:
        problems.append(f"layout {WORLD_PRODUCT} = {world} but cluster.world_size is {c.world_size}")
    if c.nodes * c.gpus_per_node != c.world_size:
        problems.append(f"cluster.nodes x gpus_per_node = {c.nodes * c.gpus_per_node} but world_size is {c.world_size}")
    if L.micro_batch_size * L.grad_accum_steps * L.dp != t.global_batch_size:
        problems.append(
            f"micro-batch x accumulation x dp = {L.micro_batch_size * L.grad_accum_steps * L.dp} but "
            f"the spec's global batch is {t.global_batch_size}"
        )
    if (doc.model.name, doc.model.seq_length, doc.model.global_batch_size, doc.model.precision) != (
        doc.spec.name,
        t.seq_length,
        t.global_batch_size,
        t.precision,
    ):
        problems.append("the model section disagrees with the spec")
    if problems:
        raise InvalidFile(f"{plan_file}: " + "; ".join(problems) + "; regenerate it with `dsorch plan`.")
