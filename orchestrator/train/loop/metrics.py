"""Per-step training metrics: one log line and one step record per step (rank 0),
appended to the run directory's metrics file (plandir/rundir.py RunDir.metrics).

That file is the input of ``dsorch calibrate``: one JSON object per line with step, loss, lr,
wall_s (seconds since the loop started), cpu_s (this rank's CPU seconds since then), grad_norm,
step_time_s, tokens_per_s, tflops_per_gpu, mfu, peak_mem_gib, mem_kind, plus the layout it ran with.
Evaluations (train/loop/validation.py) add records of their own, ``{"kind": "eval", "step", "eval_loss",
"eval_ppl", "eval_iters", "eval_time_s", "final"}``; a step record has no "kind" (calibrate/records.py is_step).
A resumed run appends: steps that ran after the last checkpoint of the interrupted run are dropped
from the file when the run resumes (``truncate``), so the file is one trajectory with no gap and no
repeated step.

Model FLOPs come from the planner's own formula (costmodel/flops.py, Megatron-LM's count), so
the achieved MFU logged here and the MFU the plan predicted are the same quantity.
"""

from __future__ import annotations

import json
import math
import resource
import time

import torch

from orchestrator.costmodel.flops import model_flops_per_step
from orchestrator.costmodel.memory import GIB
from orchestrator.plandir.reader import PlanDir
from orchestrator.plandir.rundir import RunDir


def step_model_flops(plan: PlanDir) -> float:
    return model_flops_per_step(plan.spec.model, plan.spec.training.seq_length, plan.layout.global_batch_size)


def peak_reserved_gib(device: torch.device) -> float | None:
    """What the caching allocator held at its peak (GPU only): allocated plus its free blocks, the
    figure that decides an out-of-memory error; None on CPU."""
    return torch.cuda.max_memory_reserved(device) / GIB if device.type == "cuda" else None


def peak_memory_gib(device: torch.device) -> tuple[float, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB, "cuda_max_allocated"
    # On CPU there is no allocator counter; the process's peak resident set (KiB on Linux).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "cpu_peak_rss"


EVAL_KIND = "eval"


class MetricsLog:
    def __init__(self, run_dir: RunDir | None, plan: PlanDir, world_size: int, sinks=None):
        self.path = None if run_dir is None else run_dir.metrics
        self.sinks = sinks  # train/loop/sinks.py: TensorBoard, W&B (rank 0, when the spec asks)
        # wall_s of a record: seconds from here (just before the first step) to the end of the
        # step (``clock``), all of the loop included (batch assembly, the step, the bookkeeping).
        self.t0 = time.perf_counter()
        # cpu_s: this process's CPU seconds (all its threads) over the same span; on CPU ranks that
        # share cores it measures the work done, which waiting for a core does not inflate.
        self.cpu0 = time.process_time()
        self.flops = step_model_flops(plan)
        self.tokens = plan.layout.global_batch_size * plan.spec.training.seq_length
        self.peak, self.world_size = plan.doc.cluster.peak_tflops, world_size
        lay = plan.layout
        self.layout = {
            "tp": lay.tp,
            "pp": lay.pp,
            "dp": lay.dp,
            "zero_stage": lay.zero_stage,
            "micro_batch_size": lay.micro_batch_size,
            "recompute": lay.recompute,
            "sequence_parallel": lay.sequence_parallel,
        }

    @staticmethod
    def truncate(run_dir: RunDir, last_step: int) -> int:
        """Keep the records of steps <= last_step (the checkpoint resumed from); returns how many
        were dropped. Rewritten through a temporary file, so a crash leaves the old file."""
        path = run_dir.metrics
        if not path.exists():
            return 0
        keep, dropped = [], 0
        for line in path.read_text().splitlines():
            try:
                step = json.loads(line).get("step", 0)
            except json.JSONDecodeError:
                dropped += 1  # a line cut by a crash
                continue
            if step <= last_step:
                keep.append(line)
            else:
                dropped += 1
        if dropped:
            tmp = path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(x + "\n" for x in keep))
            tmp.replace(path)
        return dropped

    def clock(self) -> tuple[float, float]:
        """(wall_s, cpu_s) now: what a record made later for a step taken now carries."""
        return time.perf_counter() - self.t0, time.process_time() - self.cpu0

    def record(
        self,
        step: int,
        loss: float,
        lr: float,
        grad_norm,
        step_time: float,
        mem_gib: float,
        mem_kind: str,
        reserved_gib: float | None = None,
        clock: tuple[float, float] | None = None,
    ) -> dict:
        tflops = self.flops / step_time / self.world_size / 1e12
        wall_s, cpu_s = clock or self.clock()
        tokens_per_s = self.tokens / step_time
        mfu = tflops / self.peak if self.peak else None
        rec = {
            "step": step,
            "loss": loss,
            "lr": lr,
            "wall_s": wall_s,
            "cpu_s": cpu_s,
            "grad_norm": None if grad_norm is None else float(grad_norm),
            "step_time_s": step_time,
            "tokens_per_s": tokens_per_s,
            "tflops_per_gpu": tflops,
            "mfu": mfu,
            "peak_mem_gib": mem_gib,
            "mem_kind": mem_kind,
            "layout": self.layout,
        }
        if reserved_gib is not None:
            rec["peak_reserved_gib"] = reserved_gib
        self._append(rec)
        mfu_text = "" if mfu is None else f" | MFU {100 * mfu:.1f}%"
        print(
            f"step {step:5d} | loss {loss:.5f} | lr {lr:.3e} | {step_time * 1e3:7.1f} ms | "
            f"{tokens_per_s:,.0f} tok/s | {tflops:.4f} TFLOP/s{mfu_text} | "
            f"peak mem {mem_gib:.2f} GiB",
            flush=True,
        )
        return rec

    def record_eval(self, step: int, loss: float, eval_iters: int, seconds: float, final: bool) -> dict:
        # Perplexity exp(loss), its exponent capped at 20 as Megatron-LM's log caps it
        # (training.py evaluate_and_print_results), so a diverged run logs a number, not inf.
        ppl = math.exp(min(20.0, loss))
        rec = {
            "kind": EVAL_KIND,
            "step": step,
            "eval_loss": loss,
            "eval_ppl": ppl,
            "eval_iters": eval_iters,
            "eval_time_s": seconds,
            "final": final,
        }
        self._append(rec)
        what = "validation after training" if final else "validation"
        print(
            f"step {step:5d} | {what} | loss {loss:.5f} | ppl {ppl:.4g} | {eval_iters} batches in {seconds:.2f} s",
            flush=True,
        )
        return rec

    def _append(self, rec: dict) -> None:
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(rec, sort_keys=True) + "\n")
        if self.sinks is not None:
            self.sinks.write(rec)

    def close(self) -> None:
        if self.sinks is not None:
            self.sinks.close()
