"""Layout search: every legal layout -> cost model -> ranked candidates and reasons for rejections.

Exhaustive: every legal (tp, pp, vpp, dp, zero stage, micro-batch, recompute, sp) is evaluated;
nothing is skipped by heuristics. Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from orchestrator.costmodel import Candidates, Evaluation, evaluate
from orchestrator.costmodel.calibration import engine_of, model_features, per_layout
from orchestrator.costmodel.evaluate import invariant_violations, runtime_engine
from orchestrator.costmodel.memory import GIB
from orchestrator.costmodel.stacks import MEMORY_KEYS, TIME_PARTS
from orchestrator.plan.layout import (
    AXES,
    AXIS,
    LAYOUT_FAMILIES,
    PINNABLE,
    RECOMPUTE_LEVELS,
    SHORT_ORDER,
    TIEBREAK,
    Layout,
    Pins,
    divisors,
    family_codes,
)
from orchestrator.plan.request import KEEP
from orchestrator.plan.rules import (
    check_layout,
    cp_degrees,
    dispatcher_problem,
    ep_degrees,
    etp_degrees,
    interleaving_fits,
    recompute_layer_options,
    sp_options,
    stage_split,
    tp_degrees,
    uses_tp_overlap,
    vpp_degrees,
)
from orchestrator.runtimes import Runtime, runtime_named
from orchestrator.spec.cluster import ClusterProfile
from orchestrator.spec.model import ModelSpec
from orchestrator.spec.training import TrainingSpec


@dataclass(frozen=True)
class Scored:
    """A layout with its predicted memory (GiB per GPU, keyed by ``MEMORY_KEYS``) and time (s, keyed
    by ``TIME_PARTS``; the step apart) stacks: all that renderers and --explain show, computed once
    by the search."""

    layout: Layout
    memory_gib: dict[str, float]
    time_s: dict[str, float]
    step_time_s: float
    tokens_per_s: float
    mfu: float
    fits: bool
    capacity_gib: float
    # How sure the step time is: the half-width of its interval as a fraction (the largest error of
    # the calibration entry it was predicted with on a run held out of its fit), None outside any
    # fitted domain; and that in words ("±12 %, deepspeed-zero3/h100-sxm5-ndr, n=5").
    interval: float | None = None
    basis: str = ""

    @property
    def over_gib(self) -> float:
        return self.memory_gib["total"] - self.capacity_gib


@dataclass(frozen=True)
class NearTies:
    """The layouts the model cannot tell from the fastest: those whose predicted step time is within
    ``band`` of it. The search chooses the simplest of them (the first in ``TIEBREAK``'s order:
    smaller degrees, fewer virtual stages, smaller micro-batches, the runtime's simpler ZeRO stage,
    less recomputation; ``solver._simplest_first``) rather than the one a difference far inside the
    model's error favours."""

    band: float  # fraction of the fastest layout's step time
    basis: str  # where the band comes from (``Resolved.tie_band_basis``)
    fastest: Scored  # the fastest layout that fits; the chosen one when it is also the simplest
    others: tuple[Scored, ...]  # the layouts within the band besides the chosen one, fastest first
    count: int  # layouts within the band, the chosen one included


@dataclass(frozen=True)
class SearchResult:
    ranked: list[Scored]  # feasible layouts, fastest first (at most `keep`)
    evaluated: int
    feasible: int
    rejected_memory: int
    closest: list[Scored]  # infeasible layouts with the smallest memory, for explanations
    capacity_gib: float
    rejected_rules: dict[str, int] = field(default_factory=dict)
    # The best layout of each family the search evaluated (plan.md's decision, dsorch plot).
    families: tuple[FamilyBest, ...] = ()
    near_ties: NearTies | None = None

    @property
    def best(self) -> Scored | None:
        return self.ranked[0] if self.ranked else None


@dataclass(frozen=True)
class FamilyBest:
    family: str
    scored: Scored  # the fastest layout of the family that fits; when none fits, the one needing least memory
    rank: int | None  # its rank among all layouts that fit (1 = chosen); None when none of the family fits
    evaluated: int  # legal layouts of the family


def _family_bests(
    cand: Candidates, ev: Evaluation, feasible_order: np.ndarray, fits: np.ndarray, capacity: float, confidence
) -> tuple[FamilyBest, ...]:
    codes = family_codes(cand.tp, cand.pp, cand.zero_stage, cand.cp)
    rank = np.empty(len(cand), dtype=np.int64)
    rank[feasible_order] = np.arange(1, len(feasible_order) + 1)
    out = []
    for code, name in enumerate(LAYOUT_FAMILIES):
        members = codes == code
        if not members.any():
            continue
        ok = feasible_order[members[feasible_order]]
        if len(ok):
            i = int(ok[0])
            out.append(
                FamilyBest(name, _scored(cand, ev, i, capacity, confidence, fits), int(rank[i]), int(members.sum()))
            )
        else:
            idx = np.flatnonzero(members)
            i = int(idx[np.lexsort((ev.time.step[idx], ev.memory.total[idx]))][0])
            out.append(FamilyBest(name, _scored(cand, ev, i, capacity, confidence, fits), None, int(members.sum())))
    return tuple(out)


def _options(pins: Pins, name: str, values):
    pinned = getattr(pins, name)
    return [v for v in values if pinned is None or v == pinned]


# Reasons a combination is ruled out before evaluation, as the plan output and --explain say them.
RULE_TP = "tp does not divide the attention or kv heads"
RULE_PP = "pp does not split the layers"
RULE_DP = "global batch not divisible by dp"
RULE_VPP = "interleaving needs micro-batches a multiple of pp"
RULE_ZERO_PP = "ZeRO-2/3 with pipeline parallelism (DeepSpeed)"
RULE_ZERO_MOE = "ZeRO-0 or ZeRO-3 with expert parallelism (DeepSpeed)"
RULE_ZERO_BF16 = "bf16 ZeRO-0 with gradient accumulation (DeepSpeed accumulates in fp32 from ZeRO-1)"
RULE_DISPATCH = "the flex dispatcher needs expert-TP x EP above 1"


def enumerate_layouts(
    model: ModelSpec, training: TrainingSpec, profile: ClusterProfile, runtime: Runtime | str, pins: Pins = Pins()
) -> tuple[Candidates, dict[str, int]]:
    """All legal layouts (honouring pins) as arrays, plus how many combinations each rule ruled
    out (counted where the rule applies: a tp degree, a (tp, pp) pair, or a whole layout)."""
    runtime = runtime_named(runtime)
    world = profile.world_size
    gbs = training.global_batch_size
    rejected: dict[str, int] = {}

    def reject(reason: str, n: int = 1) -> None:
        if n:
            rejected[reason] = rejected.get(reason, 0) + n

    rows: list[np.ndarray] = []
    legal_tp = tp_degrees(model, profile)
    reject(RULE_TP, len([t for t in _options(pins, "tp", divisors(profile.nvlink_domain)) if t not in legal_tp]))
    for tp in _options(pins, "tp", legal_tp):
        for cp in _options(pins, "cp", cp_degrees(runtime, training, world // tp, model, tp, profile.nvlink_domain)):
            for pp in _options(pins, "pp", divisors(world // (tp * cp))):
                split = stage_split(model.num_layers, pp, model.mtp_layers)
                if split is None:
                    reject(RULE_PP)
                    continue
                dp = world // (tp * cp * pp)
                if pins.dp is not None and dp != pins.dp:
                    continue
                if gbs % dp:
                    reject(RULE_DP)
                    continue
                for ep in _options(pins, "ep", ep_degrees(model, runtime, tp, cp, dp)):
                    for etp in _options(pins, "etp", etp_degrees(model, runtime, tp, cp, dp, ep, pins.etp)):
                        if dispatcher_problem(training, runtime, ep, etp):
                            reject(RULE_DISPATCH)
                            continue
                        degrees = dict(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, etp=etp)
                        rows += _layouts_at(degrees, split, model, training, runtime, pins, reject)
    return _candidates(rows), rejected


def _layouts_at(degrees, split, model, training, runtime: Runtime, pins, reject) -> list[np.ndarray]:
    """Every (vpp, micro-batch, ZeRO stage, recompute, SP) at one (tp, cp, pp, dp, ep, etp), as
    blocks of rows (``_row``'s columns; built with numpy: a DeepSeek-V3 search has ~10^5 of them)."""
    tp, cp, pp, dp = degrees["tp"], degrees["cp"], degrees["pp"], degrees["dp"]
    gbs = training.global_batch_size
    blocks = []
    all_zero = runtime.zero_stages(1, "fp32", 1, pins.zero_stage)
    vpps = vpp_degrees(runtime, model.num_layers, pp, training.overlap_p2p_comm, model.mtp_layers)
    sps = sp_options(tp, cp, training.seq_length)
    if runtime.moe_needs_sp and model.moe is not None and tp > 1:
        sps = [sp for sp in sps if sp]
    rcs = _options(pins, "recompute", RECOMPUTE_LEVELS)
    sps = _options(pins, "sequence_parallel", sps)
    inner = len(rcs) * len(sps)
    rc_codes = [AXIS["recompute"].code(rc) for rc in rcs]
    full_code = AXIS["recompute"].code("full")
    # recompute_layers: searched under full recomputation (rules.recompute_layer_options), 0 elsewhere.
    # A pinned --recompute full is Megatron-LM's full, every layer (--recompute-granularity full
    # --recompute-method uniform); recomputing only some layers is its own pin, --recompute-layers N.
    layers = 0 if pins.recompute == "full" and pins.recompute_layers is None else pins.recompute_layers
    rc_none = [0] if layers in (None, 0) else []

    def rc_layers(vpp: int) -> list[int]:
        return recompute_layer_options(model, runtime, split, vpp, layers)

    for mbs in _options(pins, "micro_batch_size", divisors(gbs // dp)):
        gas = gbs // (dp * mbs)
        zeros = runtime.zero_stages(pp, training.precision, gas, pins.zero_stage, training.fp8_param_gather)
        wanted = _options(pins, "zero_stage", all_zero)
        ok_vpps = []
        for vpp in _options(pins, "vpp", vpps):
            if interleaving_fits(vpp, pp, gas):
                ok_vpps.append(vpp)
            else:
                reject(RULE_VPP, len(wanted) * inner)
        for z in wanted:
            if z not in zeros:
                reject((RULE_ZERO_PP if z > 1 and pp > 1 else RULE_ZERO_BF16), inner * len(ok_vpps))
            elif model.moe is not None and not runtime.expert_zero_ok(degrees["ep"], z):
                reject(RULE_ZERO_MOE, inner * len(ok_vpps))
        zs = [z for z in wanted if z in zeros and (model.moe is None or runtime.expert_zero_ok(degrees["ep"], z))]
        combos = np.array(
            [
                (vpp, z, rc, n, sp)
                for vpp in ok_vpps
                for z in zs
                for rc in rc_codes
                for n in (rc_layers(vpp) if rc == full_code else rc_none)
                for sp in sps
            ],
            dtype=np.int64,
        ).reshape(-1, 5)
        if not len(combos):
            continue
        fixed = dict(degrees, micro_batch_size=mbs, grad_accum_steps=gas)
        block = np.empty((len(combos), len(AXES) + len(_SPLIT_COLUMNS)), dtype=np.int64)
        for i, a in enumerate(AXES):
            block[:, i] = fixed[a.name] if a.name in fixed else 0
        for j, name in enumerate(("vpp", "zero_stage", "recompute", "recompute_layers", "sequence_parallel")):
            block[:, _COLUMN[name]] = combos[:, j]
        block[:, len(AXES) :] = (split.first, split.middle, split.last)
        blocks.append(block)
    return blocks


# The columns of Candidates beyond the axes: decoder layers on the first, a middle and the last stage.
_SPLIT_COLUMNS = ("layers_first", "layers_middle", "layers_last")


def _row(layout: dict, split) -> tuple[int, ...]:
    """One layout (its axes by name) as a row of Candidates: every axis coded, in ``AXES`` order,
    then the stage split."""
    return (*(a.code(layout[a.name]) for a in AXES), split.first, split.middle, split.last)


_COLUMN = {a.name: i for i, a in enumerate(AXES)}


def _candidates(blocks: list[np.ndarray]) -> Candidates:
    """Blocks of rows (``_row``'s columns) as one array per column."""
    names = (*AXIS, *_SPLIT_COLUMNS)
    table = np.concatenate(blocks) if blocks else np.zeros((0, len(names)), dtype=np.int64)
    cols = table.T
    arrays = dict(zip(names, cols, strict=True))
    for a in AXES:
        if a.kind is bool:
            arrays[a.name] = arrays[a.name].astype(bool)
    return Candidates(**arrays)


def candidates_of(model: ModelSpec, layouts: list[Layout]) -> Candidates:
    """Exactly these (legal) layouts as Candidates, for one vectorized evaluation."""
    rows = [_row(L.as_dict(), stage_split(model.num_layers, L.pp, model.mtp_layers)) for L in layouts]
    return _candidates([np.array(rows, dtype=np.int64).reshape(len(rows), len(AXES) + len(_SPLIT_COLUMNS))])


def _confidence(resolved, runtime: Runtime, model: ModelSpec, training: TrainingSpec):
    """(interval, basis) of a layout: its engine's calibration entry (``resolved``, per engine), unless
    the layout goes beyond the runs that entry was fitted on."""
    eng = runtime_engine(runtime, training)
    features = model_features(model, training.seq_length)

    def of(L: Layout) -> tuple[float | None, str]:
        r = resolved[str(engine_of(runtime, L.zero_stage, L.pp).item())]
        beyond = r.beyond(
            L.tp,
            L.pp,
            L.cp,
            training.fp8 is not None,
            tp_overlap=uses_tp_overlap(runtime, training, L),
            dp_overlap=eng.dp_overlap and L.dp * L.cp > 1 and (L.pp == 1 or eng.dp_overlap_with_pp),
            megatron_fsdp=runtime.uses_fsdp(L.zero_stage),
            ep=L.ep,
            moe=model.moe is not None,
            features=features,
        )
        if beyond:
            return None, f"outside the fitted domain of {r.entry}: {beyond}"
        return r.interval, r.describe()

    return of


def _scored(c: Candidates, ev: Evaluation, i: int, capacity_gib: float, confidence, fits=None) -> Scored:
    layout = Layout(**{a.name: a.decode(getattr(c, a.name)[i]) for a in AXES})
    mem = {k: float(getattr(ev.memory, k)[i]) / GIB for k in MEMORY_KEYS}
    t = {k: float(getattr(ev.time, k)[i]) for k in TIME_PARTS}
    interval, basis = confidence(layout)
    return Scored(
        layout,
        mem,
        t,
        float(ev.time.step[i]),
        float(ev.tokens_per_s[i]),
        float(ev.mfu[i]),
        bool(mem["total"] <= capacity_gib) if fits is None else bool(fits[i]),
        capacity_gib,
        interval,
        basis,
    )


def _index_of(c: Candidates, layout: Layout) -> np.ndarray:
    """The candidates that are ``layout`` (a boolean mask: none, or one)."""
    return np.logical_and.reduce([getattr(c, a.name) == a.code(getattr(layout, a.name)) for a in AXES])


def search(
    model: ModelSpec,
    training: TrainingSpec,
    profile: ClusterProfile,
    runtime: Runtime | str,
    pins: Pins = Pins(),
    *,
    memory_margin_gib: float = 0.0,
    keep: int = KEEP,
    measured_fit: dict[Layout, bool] | None = None,
) -> SearchResult:
    """Evaluate every legal layout and rank those that fit, fastest first.

    Ties in step time are broken by lower memory, then by the layout's fields, so the ranking
    (and therefore every emitted file) is deterministic. ``measured_fit`` (`dsorch trial`): layouts
    whose fit was measured on the cluster; a measurement overrules the memory model's prediction
    either way (a trial that ran out of memory is out, one that ran is in). ``keep``: how many layouts
    are ranked, and how many of those that do not fit are kept as the closest (a plan's KEEP).
    """
    runtime = runtime_named(runtime)
    capacity = profile.gpu.memory_gib - memory_margin_gib
    cand, rejected = enumerate_layouts(model, training, profile, runtime, pins)
    n = len(cand)
    if n == 0:
        return SearchResult([], 0, 0, 0, [], capacity, rejected)
    ev = evaluate(model, training, profile, runtime, cand)
    violations = invariant_violations(cand, ev)
    if violations:  # a bug, never the user's input
        raise RuntimeError(f"cost model invariant broken for {model}: {'; '.join(violations)}")
    total_gib = ev.memory.total / GIB
    fits = total_gib <= capacity
    for layout, fit in (measured_fit or {}).items():
        fits[_index_of(cand, layout)] = fit
    simplicity = _simplicity(cand, runtime)
    keys = (*(simplicity[n] for n in reversed(TIEBREAK)), ev.memory.total, ev.time.step)
    order = np.lexsort(keys)  # last key is primary
    _, resolved = per_layout(profile, runtime, cand.zero_stage)
    confidence = _confidence(resolved, runtime, model, training)
    near_ties = None
    feasible_order = order[fits[order]]
    if len(feasible_order):
        # The band of the fastest layout's engine (the deepspeed runtime mixes two).
        r = resolved[str(engine_of(runtime, cand.zero_stage[feasible_order[0]]).item())]
        feasible_order, within = _simplest_first(simplicity, ev.time.step, feasible_order, r.tie_band)
        near_ties = NearTies(
            band=r.tie_band,
            basis=r.tie_band_basis,
            fastest=_scored(cand, ev, int(order[fits[order]][0]), capacity, confidence, fits),
            others=tuple(_scored(cand, ev, int(i), capacity, confidence, fits) for i in within[:keep]),
            count=len(within) + 1,
        )
    ranked = [_scored(cand, ev, int(i), capacity, confidence, fits) for i in feasible_order[:keep]]
    infeasible = np.flatnonzero(~fits)
    # The closest are layouts a user would run (``runnable``), unless no layout that does not fit is.
    sensible = infeasible[runnable(cand, training, pins)[infeasible]]
    pool = sensible if len(sensible) else infeasible
    closest_idx = pool[np.lexsort((ev.time.step[pool], ev.memory.total[pool]))][:keep]
    closest = [_scored(cand, ev, int(i), capacity, confidence, fits) for i in closest_idx]
    families = _family_bests(cand, ev, feasible_order, fits, capacity, confidence)
    return SearchResult(
        ranked, n, int(fits.sum()), int((~fits).sum()), closest, capacity, rejected, families, near_ties
    )


# The fewest tokens of a sequence a context-parallel rank holds in a layout the does-not-fit
# explanation names: the smallest share among the published runs with cp > 1 that dsorch's
# calibration files hold (8,192-token sequences at cp 2: Llama 3.1 405B and Grok-1 in the MoE sets).
# Below it cp buys memory with a step's time (issue 37: "tp4+sp cp32 ..." named for a 4,096-token
# sequence).
SUGGESTED_MIN_CP_TOKENS = 4096


def runnable(layouts, training: TrainingSpec, pins: Pins = Pins()) -> np.ndarray:
    """Which layouts (Candidates, or one Layout) a user would run, beyond being legal: what the
    does-not-fit explanation may name (the closest layout, the layout at a node minimum). Each rank of
    context parallelism keeps at least ``SUGGESTED_MIN_CP_TOKENS`` of the sequence, and a pipeline gets
    at least one micro-batch per stage from the global batch (fewer never fills it: Narayanan et al.
    2021, Sec. 2.2, the bubble (p - 1) / m). An axis the user pinned is theirs: not judged here."""
    cp, pp, gas = (np.asarray(getattr(layouts, n)) for n in ("cp", "pp", "grad_accum_steps"))
    ok = np.ones(np.shape(cp), dtype=bool)
    if pins.cp is None:
        ok &= (cp == 1) | (training.seq_length // cp >= SUGGESTED_MIN_CP_TOKENS)
    if pins.micro_batch_size is None:
        ok &= (pp == 1) | (gas >= pp)
    return ok


def _simplicity(cand: Candidates, runtime: Runtime) -> dict[str, np.ndarray]:
    """Each ``TIEBREAK`` axis as the search compares simplicity: its code (smaller is simpler), but
    the ZeRO stage by its place in the runtime's ``zero_simplest_first`` (on Megatron-LM the
    distributed optimizer is simpler than ZeRO-0)."""
    keys = {n: getattr(cand, n) for n in TIEBREAK}
    keys["zero_stage"] = runtime.zero_simplicity(cand.zero_stage)
    return keys


def _simplest_first(simplicity: dict[str, np.ndarray], step: np.ndarray, feasible_order: np.ndarray, band: float):
    """``feasible_order`` (fastest first) with the simplest layout within ``band`` of the fastest
    moved to the front, and the other layouts within the band, fastest first.

    Simpler is read off ``TIEBREAK``, each axis by its ``simplicity`` key (``_simplicity``: smaller
    degrees, fewer virtual stages, smaller micro-batches, the runtime's simpler ZeRO stage, less
    recomputation, no SP): a layout replaces the fastest only when it is at least as simple on *every*
    axis, so a near-tie never trades one complication for another (a smaller tp for full
    recomputation); among those the first in ``TIEBREAK``'s order wins (lexsort is stable, and no two
    layouts agree on every axis)."""
    fastest = feasible_order[0]
    within = feasible_order[step[feasible_order] <= step[fastest] * (1.0 + band)]
    simpler = np.logical_and.reduce([simplicity[n][within] <= simplicity[n][fastest] for n in TIEBREAK])
    pool = within[simpler]
    simplest = pool[np.lexsort(tuple(simplicity[n][pool] for n in reversed(TIEBREAK)))][0]
    rest = feasible_order[feasible_order != simplest]
    return np.concatenate(([simplest], rest)), within[within != simplest]


# What a best-effort completion of the pins takes for an axis left to the search: its neutral value,
# but the distributed optimizer (ZeRO-1) and one sequence per micro-batch.
_COMPLETION = {"zero_stage": 1, "micro_batch_size": 1}


def explain_pins(
    model: ModelSpec, training: TrainingSpec, profile: ClusterProfile, runtime: Runtime | str, pins: Pins
) -> list[str]:
    """Why pinned values admit no legal layout: the rules a best-effort completion breaks."""
    world = profile.world_size
    values = {
        a.name: getattr(pins, a.name) if getattr(pins, a.name) is not None else _COMPLETION.get(a.name, a.neutral)
        for a in PINNABLE
    }
    if values["dp"] is None:
        split = [n for n in SHORT_ORDER if AXIS[n].splits_world and n != "dp"]
        product = math.prod(values[n] for n in split)
        if world % product:
            return [
                f"{'*'.join(split)} = {'*'.join(str(values[n]) for n in split)} = {product} does not divide the "
                f"cluster's {world} GPUs ({profile.nodes} x {profile.gpus_per_node}); choose degrees whose product "
                f"divides {world}"
            ]
        values["dp"] = max(1, world // product)
    gas = max(1, training.global_batch_size // (values["micro_batch_size"] * values["dp"]))
    layout = Layout(**values, grad_accum_steps=gas)
    return check_layout(layout, model, training, profile, runtime)


# How far above the profile's node count ``minimum_nodes`` looks: 64 times.
NODE_SCAN_FACTOR = 64


@dataclass(frozen=True)
class NodeCount:
    """The smallest node count found at which a layout a user would run fits (``minimum_nodes``)."""

    nodes: int
    best: Scored  # the fastest layout a user would run that fits there
    # Every count between the profile's and ``nodes`` was searched or ruled out by the states' bound,
    # so no fewer nodes will do; else ``searched`` lists the counts below it that were tried.
    least: bool
    searched: tuple[int, ...]


def minimum_nodes(
    model: ModelSpec,
    training: TrainingSpec,
    profile: ClusterProfile,
    runtime: Runtime | str,
    pins: Pins = Pins(),
    *,
    memory_margin_gib: float = 0.0,
    max_factor: int = NODE_SCAN_FACTOR,
) -> NodeCount | None:
    """The smallest node count (above the profile's) at which a layout a user would run (``runnable``)
    fits, with that layout; None when no count up to ``max_factor`` times the profile's has one.

    Node counts whose GPUs together cannot hold one copy of the weights, gradients and optimizer
    states (the bytes per parameter of the runtime's most sharded stage) are skipped unsearched: no
    layout fits there, and a search of a 671B-parameter MoE model costs a second. Past 32 counts the
    scan doubles, so a count found there is one that fits, not always the least (``NodeCount.least``)."""
    w, g, o = runtime_named(runtime).state_bytes(training.precision, 3, training.grad_reduce_in_fp32)
    states = float(model.num_params + model.mtp_params) * (float(w) + float(g) + float(o))
    per_node = profile.gpus_per_node * max(profile.gpu.memory_gib - memory_margin_gib, 1e-9) * GIB
    bound = math.ceil(states / per_node)
    if bound > profile.nodes * max_factor:
        return None
    start = max(profile.nodes + 1, bound)
    # Every count just above the profile's, then doublings: a search takes milliseconds, but a
    # scan of every count up to 64x would not.
    doublings = (n for k in range(1, 7) if (n := profile.nodes * 2**k) >= start)
    counts = sorted({*range(start, start + 32), *doublings})
    searched: list[int] = []
    for nodes in [n for n in counts if n <= profile.nodes * max_factor]:
        res = search(model, training, profile.resized(nodes=nodes), runtime, pins, memory_margin_gib=memory_margin_gib)
        fitting = [s for s in res.ranked if runnable(s.layout, training, pins)]
        if fitting:
            return NodeCount(nodes, fitting[0], searched == list(range(start, nodes)), tuple(searched))
        searched.append(nodes)
    return None
