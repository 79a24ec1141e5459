"""The two stacks the cost model predicts for a layout, named once for every reader.

``MemoryStack`` (bytes per GPU on the binding pipeline stage) and ``TimeStack`` (seconds per step on
the slowest stage) hold one array per part, in the order every table and picture shows them, the last
field being the sum of the others. Their field names are the keys of plan.yaml's
``memory_gib_per_gpu`` and ``time_breakdown_s``, and the labels below are what --explain, plan.md, the
console and the plots call them: a new term (expert parallelism's all-to-all) is one field here and
one label, and every reader shows it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryStack:
    params: np.ndarray  # the weights (and, with FP8, their cached FP8 copies)
    grads: np.ndarray
    optimizer: np.ndarray  # optimizer states: fp32 master weights, Adam's moments
    activations: np.ndarray
    comm_buffers: np.ndarray  # DeepSpeed's reduce/all-gather buckets, ZeRO-3 gathered layers
    framework: np.ndarray  # the profile's memory_overhead_gib (CUDA context, NCCL, fragmentation)
    total: np.ndarray


@dataclass(frozen=True, kw_only=True, slots=True)
class TimeStack:
    # Communication is what the step waits for: the part the engine overlaps with compute is not in
    # it (Evaluation keeps the totals before overlap apart).
    compute: np.ndarray
    tp_comm: np.ndarray
    bubble: np.ndarray
    pp_comm: np.ndarray
    dp_comm: np.ndarray
    cp_comm: np.ndarray
    ep_comm: np.ndarray  # expert parallelism's dispatch and combine all-to-all
    optimizer: np.ndarray  # the optimizer step
    step: np.ndarray


MEMORY_KEYS: tuple[str, ...] = tuple(f.name for f in fields(MemoryStack))
MEMORY_PARTS = MEMORY_KEYS[:-1]  # without the total
TIME_KEYS: tuple[str, ...] = tuple(f.name for f in fields(TimeStack))
TIME_PARTS = TIME_KEYS[:-1]  # without the step


@dataclass(frozen=True, kw_only=True, slots=True)
class Label:
    column: str  # a table's column header, a plot's legend entry
    words: str  # in a sentence: "the largest part is ...", "compared with the chosen layout: ..."


# One label per field of each stack (tests/test_costmodel.py checks that none is missing).
MEMORY_LABELS: dict[str, Label] = {
    "params": Label(column="weights", words="weights"),
    "grads": Label(column="grads", words="gradients"),
    "optimizer": Label(column="optimizer", words="optimizer state"),
    "activations": Label(column="activations", words="activations"),
    "comm_buffers": Label(column="buffers", words="communication buffers"),
    "framework": Label(column="framework", words="framework overhead"),
    "total": Label(column="total", words="memory per GPU"),
}
TIME_LABELS: dict[str, Label] = {
    "compute": Label(column="compute", words="compute"),
    "tp_comm": Label(column="TP comm", words="exposed TP communication"),
    "bubble": Label(column="bubble", words="pipeline bubble"),
    "pp_comm": Label(column="PP sends", words="pipeline sends"),
    "dp_comm": Label(column="DP comm", words="exposed DP communication"),
    "cp_comm": Label(column="CP comm", words="exposed CP communication"),
    "ep_comm": Label(column="EP a2a", words="exposed expert-parallel all-to-all"),
    "optimizer": Label(column="optimizer", words="optimizer step"),
    "step": Label(column="step", words="step time"),
}
