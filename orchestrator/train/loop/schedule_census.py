"""What DeepSpeed's PipelineEngine really executes, instruction by instruction (``--schedule-census DIR``).

The cost model predicts a pipeline step from a model of DeepSpeed's TrainSchedule
(costmodel/pipe_schedule.py). This records, on every rank and every step, each instruction the
engine runs (its name, its buffer, its start and end on the host's monotonic clock, which all
processes of a machine share) and each collective and point-to-point call it makes through
``deepspeed.comm`` (the operation, its bytes, start and end), and writes them to
DIR/schedule-rankN.json after every step. tests/system/test_schedule_census.py compares them with
the model's instruction stream and its timing.

The engine looks its instructions up in ``self._INSTRUCTION_MAP`` (engine.py ``_exec_schedule``);
an instance attribute of the same name, wrapping each method with a timer, shadows the class's
table for this engine alone. Nothing else in the engine changes.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import deepspeed.comm as dist

COMM_OPS = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "send", "recv")


def _nbytes(args, kwargs) -> int:
    t = kwargs.get("tensor", args[0] if args else None)
    return int(t.numel() * t.element_size()) if hasattr(t, "numel") else 0


def record_schedule(engine, out_dir: Path, rank: int) -> None:
    """Time every instruction and communication call of ``engine`` from now on (see the module)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    clock = time.perf_counter
    doc = {
        "rank": rank,
        "stage": engine.stage_id,
        "stages": engine.num_stages,
        "micro_batches": engine.micro_batches,
        "dp_rank": engine.grid.data_parallel_id,
        "steps": [],
    }
    step: dict = {}

    def timed(name, fn):
        def run(self, **kwargs):
            t0 = clock()
            fn(self, **kwargs)
            step.setdefault("instructions", []).append(
                {"name": name, "buffer": kwargs.get("buffer_id"), "start": t0, "end": clock()}
            )

        return run

    engine._INSTRUCTION_MAP = {cls: timed(cls.__name__, fn) for cls, fn in type(engine)._INSTRUCTION_MAP.items()}

    def comm(op, fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            t0 = clock()
            out = fn(*args, **kwargs)
            if "start" in step:
                step["comm"].append({"op": op, "bytes": _nbytes(args, kwargs), "start": t0, "end": clock()})
            return out

        return run

    for op in COMM_OPS:
        setattr(dist, op, comm(op, getattr(dist, op)))
    inner = engine.train_batch

    def train_batch(*args, **kwargs):
        step.clear()
        step.update(start=clock(), instructions=[], comm=[])
        out = inner(*args, **kwargs)
        step["end"] = clock()
        doc["steps"].append(dict(step))
        (out_dir / f"schedule-rank{rank}.json").write_text(json.dumps(doc))
        return out

    engine.train_batch = train_batch
