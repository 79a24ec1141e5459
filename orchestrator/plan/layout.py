"""A parallel layout: degrees and batch arithmetic, nothing else (cf. torchtitan's ParallelDims),
and the table of its axes.

``Layout`` is the one field list. ``AXES`` says, for each field, what the rest of dsorch needs to
know to carry it without naming it: its CLI pin flag, range and help (the click options of
`dsorch plan`/`trial`/`replan` and the regenerate line in plan.yaml), its description in files
(the schemas' field descriptions, shown by the plan.yaml reference page), how ``short()`` writes it,
what a file written before the axis existed means by its absence, whether it splits the world,
and how it is coded in the solver's arrays. ``Pins`` (every field optional), plan.yaml's and the
calibration records' layout schemas (``layout_schema``) and the arrays' columns are made from it.

A new axis is one ``Layout`` field, one ``AXES`` row, its legality rules (``orchestrator.plan.rules``),
its cost terms (``orchestrator.costmodel``) and its flags (``orchestrator.render``).

The solver produces Layouts; the renderers and the training entrypoint consume them. Legality
rules that depend on the model, the cluster or the runtime live in ``orchestrator.plan.rules``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
import pydantic

RECOMPUTE_LEVELS: tuple[str, ...] = ("none", "selective", "full")


# Families of layouts, named by what dominates their communication (the seed's decision guide:
# DDP, ZeRO-3/FSDP, Megatron TP, pipeline; context parallelism for long sequences), in the order a
# tie between them is reported.
LAYOUT_FAMILIES: tuple[str, ...] = ("context-parallel", "pipeline", "zero3", "tp-heavy", "data-parallel")


def family_codes(tp, pp, zero_stage, cp):
    """Index into LAYOUT_FAMILIES of each layout (arrays of degrees, or scalars): the first of context
    parallelism, a pipeline, ZeRO-3, tensor parallelism that the layout uses; else data parallel."""
    tp, pp, zero_stage, cp = (np.asarray(v) for v in (tp, pp, zero_stage, cp))
    return np.select([cp > 1, pp > 1, zero_stage == 3, tp > 1], [0, 1, 2, 3], default=4)


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    tp: int
    pp: int
    dp: int
    vpp: int
    zero_stage: int
    micro_batch_size: int
    grad_accum_steps: int
    recompute: str
    sequence_parallel: bool
    # Context parallelism (Megatron-LM --context-parallel-size): the sequence split over cp ranks,
    # ring attention between them. The global batch is not split by it.
    cp: int = 1
    # Expert parallelism (mixture-of-experts models): the routed experts of every MoE layer split
    # over ep ranks, each expert's matrices over etp ranks. Megatron-Core folds the expert mesh out
    # of the same GPUs as the attention's: etp x ep x expert-dp = tp x cp x dp
    # (core/parallel_state.py, expert_tensor_and_model_parallel groups), so neither multiplies the
    # world size. Both are 1 for a dense model.
    ep: int = 1
    etp: int = 1
    # Partial recomputation (recompute "full" only): the first N decoder layers of each pipeline
    # stage (of each virtual stage with interleaving) are recomputed, the rest keep their
    # activations (Megatron-LM --recompute-method block --recompute-num-layers N; core/recompute.py
    # runs chunk_runner with the checkpoint for layer_idx < recompute_num_layers). 0: every layer.
    recompute_layers: int = 0

    def __post_init__(self) -> None:
        for axis in AXES:
            value = getattr(self, axis.name)
            if axis.choices and value not in axis.choices:
                raise ValueError(f"{axis.name} must be one of {axis.choices}, got {value!r}")
            if axis.kind is int and not axis.low <= value <= axis.high:
                raise ValueError(f"{axis.name} must be in {axis.low}..{axis.high}, got {value}")

    @property
    def family(self) -> str:
        return LAYOUT_FAMILIES[int(family_codes(self.tp, self.pp, self.zero_stage, self.cp))]

    @property
    def world_size(self) -> int:
        return world_of(self.as_dict())

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.grad_accum_steps * self.dp

    def as_dict(self) -> dict:
        return asdict(self)

    def short(self) -> str:
        """One line, e.g. ``tp8+sp cp2 pp4 vpp2 dp8 zero1 mbs1 gas16 rc=selective``."""
        return short_text(self.as_dict())


@dataclass(frozen=True, kw_only=True, slots=True)
class Axis:
    """One field of ``Layout``: what every reader and writer of layouts needs to know of it."""

    name: str  # the Layout field, the key in plan.yaml and in calibration records
    help: str  # the CLI pin's help (`dsorch plan --tp`): what pinning it does
    # What the value is, for readers of files: the description of the key in plan.yaml's and the
    # calibration records' schemas (``layout_schema``), which the reference page shows
    # (scripts/gen_docs.py). Names the Megatron-LM / DeepSpeed setting it becomes where one does.
    doc: str
    label: str  # in prose (`dsorch diff`: "ZeRO stage 1 -> 3")
    column: str  # its column in `dsorch plan`'s table
    kind: type = int  # int, bool or str
    low: int = 1  # int axes: the range a pin and a file may take
    high: int = 1_000_000
    choices: tuple[str, ...] = ()  # str axes: the values, in the order of their codes in the arrays
    # The CLI pin (`dsorch plan --tp 8`); None for what follows from the other axes.
    flag: str | None = None
    # The Megatron-LM flag that sets it to its value (a switch for a bool axis): render/megatron.py
    # emits it, render/overrides.py refuses it in a spec's overrides. None where no one flag does.
    megatron_flag: str | None = None
    # The value at which the axis is not used (tp 1, ZeRO 0, no recompute). A calibration record
    # may leave such an axis out; ``since_0_1=False`` axes may be absent from plan directories and
    # checkpoints written before they existed, and mean this value there.
    neutral: Any = None
    since_0_1: bool = True
    short: str = "{}"  # how short() writes it
    omit_neutral: bool = False  # short() leaves it out at its neutral value
    splits_world: bool = False  # world size = the product of these

    def code(self, value) -> int:
        """The value in the solver's integer arrays."""
        return self.choices.index(value) if self.choices else int(value)

    def decode(self, code) -> Any:
        return self.choices[int(code)] if self.choices else self.kind(code)

    def pin_words(self, value) -> list[str]:
        """The CLI words that pin this value (the regenerate line of plan.yaml)."""
        assert self.flag is not None, f"{self.name} has no CLI pin"
        if self.kind is bool:
            on, off = self.flag.split("/")
            return [on if value else off]
        return [self.flag, str(value)]


AXES: tuple[Axis, ...] = (
    Axis(
        name="tp",
        label="tp",
        column="TP",
        flag="--tp",
        megatron_flag="--tensor-model-parallel-size",
        high=1024,
        neutral=1,
        short="tp{}",
        splits_world=True,
        help="Pin the tensor-parallel degree.",
        doc="Tensor-parallel degree: each layer's matrices split over this many ranks (Megatron-LM "
        "`--tensor-model-parallel-size`).",
    ),
    Axis(
        name="pp",
        label="pp",
        column="PP",
        flag="--pp",
        megatron_flag="--pipeline-model-parallel-size",
        neutral=1,
        short="pp{}",
        splits_world=True,
        help="Pin the pipeline-parallel degree.",
        doc="Pipeline-parallel degree: the decoder layers split into this many stages (Megatron-LM "
        "`--pipeline-model-parallel-size`; DeepSpeed's pipeline engine under the deepspeed runtime).",
    ),
    Axis(
        name="dp",
        label="dp",
        column="DP",
        flag="--dp",
        high=1_000_000_000,
        short="dp{}",
        splits_world=True,
        help="Pin the data-parallel degree.",
        doc="Data-parallel degree: model replicas, the world size over tp x cp x pp (no flag: Megatron-LM and "
        "DeepSpeed derive it from the world size).",
    ),
    Axis(
        name="vpp",
        label="vpp",
        column="VPP",
        flag="--vpp",
        neutral=1,
        short="vpp{}",
        omit_neutral=True,
        help="Pin virtual pipeline stages per rank (interleaved schedule; megatron runtime only).",
        doc="Virtual pipeline stages per pipeline rank, 1 without the interleaved schedule (megatron runtime: "
        "Megatron-LM `--num-layers-per-virtual-pipeline-stage` or `--pipeline-model-parallel-layout`).",
    ),
    Axis(
        name="zero_stage",
        label="ZeRO stage",
        column="ZeRO",
        flag="--zero",
        low=0,
        high=3,
        neutral=0,
        short="zero{}",
        help="Pin the ZeRO stage (megatron runtime: 1 = distributed optimizer, 2 = Megatron-FSDP "
        "optim_grads, gradients sharded too; 2 is searched only when pinned).",
        doc="ZeRO stage, 0 to 3 (DeepSpeed `zero_optimization.stage`; megatron runtime: 1 is "
        "`--use-distributed-optimizer`, 2 is Megatron-FSDP, `--use-megatron-fsdp "
        "--data-parallel-sharding-strategy optim_grads`).",
    ),
    Axis(
        name="micro_batch_size",
        label="micro-batch",
        column="MBS",
        flag="--mbs",
        megatron_flag="--micro-batch-size",
        high=100_000_000,
        short="mbs{}",
        help="Pin the micro-batch size (sequences).",
        doc="Sequences per micro-batch on each data-parallel rank (Megatron-LM `--micro-batch-size`, DeepSpeed "
        "`train_micro_batch_size_per_gpu`).",
    ),
    Axis(
        name="grad_accum_steps",
        label="grad accumulation",
        column="GAS",
        high=100_000_000,
        short="gas{}",
        help="Micro-batches per optimizer step: the global batch over micro-batch size x dp.",
        doc="Micro-batches per optimizer step, the global batch over micro-batch size x dp (DeepSpeed "
        "`gradient_accumulation_steps`; Megatron-LM derives it from `--global-batch-size`).",
    ),
    Axis(
        name="recompute",
        label="recompute",
        column="recompute",
        kind=str,
        choices=RECOMPUTE_LEVELS,
        flag="--recompute",
        neutral="none",
        short="rc={}",
        help="Pin activation recomputation: none, selective (the attention core) or full (every decoder "
        "layer, as Megatron-LM's --recompute-granularity full; --recompute-layers N recomputes only some).",
        doc="Activation recomputation, Megatron-LM `--recompute-granularity`: none, selective (the attention "
        "core) or full (every decoder layer).",
    ),
    Axis(
        name="sequence_parallel",
        label="sequence parallel",
        column="SP",
        kind=bool,
        flag="--sp/--no-sp",
        megatron_flag="--sequence-parallel",
        neutral=False,
        short="+sp",
        omit_neutral=True,
        help="Pin sequence parallelism on or off.",
        doc="Sequence parallelism: the tensor-parallel ranks split the sequence outside the tensor-parallel "
        "regions (Megatron-LM `--sequence-parallel`).",
    ),
    Axis(
        name="cp",
        label="cp",
        column="CP",
        flag="--cp",
        megatron_flag="--context-parallel-size",
        neutral=1,
        since_0_1=False,
        short="cp{}",
        omit_neutral=True,
        splits_world=True,
        help="Pin the context-parallel degree (ring attention; megatron runtime only).",
        doc="Context-parallel degree: each sequence split over this many ranks, ring attention between them "
        "(Megatron-LM `--context-parallel-size`).",
    ),
    Axis(
        name="ep",
        label="ep",
        column="EP",
        flag="--ep",
        megatron_flag="--expert-model-parallel-size",
        neutral=1,
        since_0_1=False,
        short="ep{}",
        omit_neutral=True,
        help="Pin the expert-parallel degree (mixture-of-experts models): routed experts split over "
        "this many ranks of tp x cp x dp.",
        doc="Expert-parallel degree: the routed experts of each MoE layer split over this many ranks, 1 for a "
        "dense model (Megatron-LM `--expert-model-parallel-size`).",
    ),
    Axis(
        name="etp",
        label="etp",
        column="ETP",
        flag="--etp",
        megatron_flag="--expert-tensor-parallel-size",
        neutral=1,
        since_0_1=False,
        short="etp{}",
        omit_neutral=True,
        help="Pin the expert tensor-parallel degree (mixture-of-experts models): each expert's "
        "matrices split over this many ranks, apart from tp.",
        doc="Expert tensor-parallel degree: each expert's matrices split over this many ranks, 1 for a dense model "
        "(Megatron-LM `--expert-tensor-parallel-size`).",
    ),
    Axis(
        name="recompute_layers",
        label="recomputed layers per stage",
        column="RC layers",
        flag="--recompute-layers",
        low=0,
        neutral=0,
        since_0_1=False,
        short="/{}",
        omit_neutral=True,
        help="Pin partial recomputation: the decoder layers full recomputation reruns in each (virtual) "
        "pipeline stage (Megatron-LM --recompute-method block; megatron runtime only); 0 recomputes every "
        "layer. A value above 0 implies full recomputation; searched only where --recompute is not pinned.",
        doc="Under full recomputation, the decoder layers recomputed in each (virtual) pipeline stage, 0 for every "
        "layer (Megatron-LM `--recompute-method block --recompute-num-layers`).",
    ),
)
AXIS: dict[str, Axis] = {a.name: a for a in AXES}
# The order of short(): sequence parallelism is a mode of tp, cp splits what tp leaves.
SHORT_ORDER = (
    "tp",
    "sequence_parallel",
    "cp",
    "ep",
    "etp",
    "pp",
    "vpp",
    "dp",
    "zero_stage",
    "micro_batch_size",
    "grad_accum_steps",
    "recompute",
    "recompute_layers",
)
# The order of simplicity, each axis by its code (smaller is simpler: smaller degrees, fewer virtual
# stages, smaller micro-batches, lower ZeRO stage, less recomputation, no SP): equal step time and
# memory, the layout with the smaller value of the first of these wins (the search's lexsort keys),
# and a near-tie goes to a layout no more complex on any of them (solver._simplest_first). Every
# searched axis is in it; dp and grad_accum_steps follow from the others.
TIEBREAK = (
    "tp",
    "pp",
    "cp",
    "ep",
    "etp",
    "vpp",
    "micro_batch_size",
    "zero_stage",
    "recompute",
    "recompute_layers",
    "sequence_parallel",
)
# "tp*cp*pp*dp", for messages about the world size.
WORLD_PRODUCT = "*".join(n for n in SHORT_ORDER if AXIS[n].splits_world)


def world_of(values: Mapping[str, Any]) -> int:
    """GPUs a layout takes: the product of the axes that split the world (tp x cp x pp x dp)."""
    return math.prod(values[a.name] for a in AXES if a.splits_world)


def short_text(values: Mapping[str, Any]) -> str:
    """A layout in one line, the axes in ``SHORT_ORDER``, each as its ``short`` pattern, those that
    omit it at their neutral value left out. ``values`` may hold a value no Layout takes (the
    calibration's torchtitan recompute "op")."""
    out = ""
    for name in SHORT_ORDER:
        axis, value = AXIS[name], values[name]
        if axis.omit_neutral and value == axis.neutral:
            continue
        text = axis.short.format(value)
        out += text if text.startswith(("+", "/")) or not out else " " + text
    return out


def _pins_of(cls, layout: Layout) -> Pins:
    """The pins that make the search evaluate exactly ``layout`` (its trial, its re-plan)."""
    return cls(**{f.name: getattr(layout, f.name) for f in dataclasses.fields(cls)})


def _all_pinned(self) -> bool:
    return all(getattr(self, f.name) is not None for f in dataclasses.fields(self))


def _pinned(self) -> dict[str, Any]:
    """The pinned axes and their values, in table order."""
    return {a.name: getattr(self, a.name) for a in PINNABLE if getattr(self, a.name) is not None}


def _pin_words(self) -> list[str]:
    """The CLI words of the pinned axes, in table order (`dsorch plan ... --tp 8 --cp 2`)."""
    return [word for name, value in _pinned(self).items() for word in AXIS[name].pin_words(value)]


PINNABLE: tuple[Axis, ...] = tuple(a for a in AXES if a.flag is not None)

if TYPE_CHECKING:  # the fields are the pinnable axes, made below: a type checker sees them as Any

    class Pins:
        def __init__(self, **pins: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...
        @classmethod
        def of(cls, layout: Layout) -> Pins: ...
        def all_pinned(self) -> bool: ...
        def words(self) -> list[str]: ...
        def pinned(self) -> dict[str, Any]: ...
        def replaced(self, **changes: Any) -> Pins: ...

else:
    # Layout fields fixed by the user; None means 'search it'. Pins.of(layout) pins a whole layout.
    Pins = dataclasses.make_dataclass(
        "Pins",
        [(a.name, a.kind | None, dataclasses.field(default=None)) for a in PINNABLE],
        frozen=True,
        kw_only=True,
        slots=True,
        namespace={
            "of": classmethod(_pins_of),
            "all_pinned": _all_pinned,
            "words": _pin_words,
            "pinned": _pinned,
            "replaced": lambda self, **changes: dataclasses.replace(self, **changes),
            "__doc__": "Layout fields fixed by the user; None means 'search it'.",
        },
    )
    Pins.__module__ = __name__


if TYPE_CHECKING:  # what layout_schema makes: a pydantic model with one attribute per axis

    class LayoutDoc(pydantic.BaseModel):
        def __getattr__(self, name: str) -> Any: ...

else:
    LayoutDoc = pydantic.BaseModel


def _field_type(axis: Axis):
    if axis.choices:
        return Literal[axis.choices]
    if axis.kind is int:
        return Annotated[int, pydantic.Field(ge=axis.low, le=axis.high)]
    return axis.kind


def layout_schema(name: str, *, record: bool) -> type[LayoutDoc]:
    """The pydantic model of a layout in a file: plan.yaml's ``layout`` section (``record=False``:
    every axis required but those added after 0.1) or a calibration record's (``record=True``:
    axes at their neutral value may be left out; grad_accum_steps follows from the batch)."""
    fields: dict[str, Any] = {}
    for a in AXES:
        t = _field_type(a)
        if record and a.neutral is None and a.flag is None:
            t, default = t | None, None
        elif (record and a.neutral is not None) or not a.since_0_1:
            default = a.neutral
        else:
            default = ...
        fields[a.name] = (t, pydantic.Field(default, description=a.doc))
    config = pydantic.ConfigDict(extra="forbid", frozen=True)
    return pydantic.create_model(name, __config__=config, __module__=__name__, **fields)


def divisors(n: int) -> list[int]:
    """All positive divisors of n, ascending."""
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
        i += 1
    return small + large[::-1]
