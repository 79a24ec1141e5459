"""Megatron-LM's own log lines as the run directory's step records (plandir/rundir.py RunDir.metrics).

A `--runtime megatron` job runs Megatron-LM's pretrain_gpt.py, which writes no such records; what
it says about a step is in two kinds of lines on its stdout (Megatron-LM d98e8a6):

- megatron/training/training.py ``training_log``, from the last rank (``print_rank_last``) every
  ``--log-interval`` iterations and after the first one::

     [2026-12-03 15:01:02.123456] iteration       10/     100 | consumed samples:          320 |
     elapsed time per iteration (ms): 1234.5 | learning rate: 1.000000E-04 | global batch size:    32 |
     lm loss: 7.012345E+00 | loss scale: 1.0 | grad norm: 3.210 | number of skipped iterations:   0 |
     number of nan iterations:   0 |

  (one line; the time is an average over the iterations since the previous line);
- megatron/training/utils/common_utils.py ``report_memory``, from every rank whose data-parallel
  rank is 0, after the first iterations and around checkpoint saves::

    [Rank 3] (after 10 iterations) memory (MB) | allocated: 100.00 | max allocated: 200.00 | ...

``MegatronLog`` turns them into the records the bundled entrypoint writes (train/loop/metrics.py:
step, loss, lr, grad_norm, step_time_s, peak_mem_gib, mem_kind), so that `dsorch status`, `logs`,
`trial` and `calibrate` read a Megatron-LM run through calibrate/records.py like any other.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from orchestrator.costmodel.memory import GIB

# " iteration       10/     100 |" then "key: value |" fields (training_log's format strings).
_ITERATION = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|(.*)$")
# "[Rank 3] (after 10 iterations) memory (MB) | allocated: 1.00 | max allocated: 2.00 | ...".
_MEMORY = re.compile(r"\[Rank (\d+)\] (.*?) memory \(MB\)((?:\s*\|[^|]+)+)")
# Where a report starts: report_memory's "[Rank N] ", training_log's " [timestamp] iteration N/".
_REPORT_START = re.compile(r"(?=\[Rank \d+\] )|(?=\[[^\]]*\] iteration\s+\d+/)")
# training_log's field names, and the step record keys they become (train/loop/metrics.py).
_FIELDS = {
    "lm loss": "loss",  # pretrain_gpt.py loss_func reports the language-model loss under this key
    "learning rate": "lr",
    "grad norm": "grad_norm",
    "consumed samples": "consumed_samples",
}
# report_memory's figure: torch.cuda.max_memory_allocated, in MiB (it divides by 1024 * 1024),
# the same counter the entrypoint records as "cuda_max_allocated" (train/loop/metrics.py).
MEM_KIND = "cuda_max_allocated"
MIB = 2**20


def _fields(tail: str) -> dict[str, float]:
    """The "key: value" fields of a line after its first "|"; a field that is not a number is skipped."""
    out = {}
    for part in tail.split("|"):
        key, sep, value = part.rpartition(":")
        if not sep:
            continue
        try:
            out[key.strip()] = float(value)
        except ValueError:
            continue
    return out


def parse_iteration(line: str) -> dict | None:
    """A training_log line as a step record (no memory yet), else None."""
    m = _ITERATION.search(line)
    if m is None:
        return None
    fields = _fields(m.group(3))
    ms = fields.get("elapsed time per iteration (ms)")
    if ms is None:
        return None
    rec: dict = {"step": int(m.group(1)), "train_iters": int(m.group(2))}
    rec.update({key: fields[name] for name, key in _FIELDS.items() if name in fields})
    if "consumed_samples" in rec:
        rec["consumed_samples"] = int(rec["consumed_samples"])
    rec["step_time_s"] = ms / 1000.0
    if "throughput per GPU (TFLOP/s/GPU)" in fields:  # --log-throughput
        rec["tflops_per_gpu"] = fields["throughput per GPU (TFLOP/s/GPU)"]
    rec.setdefault("loss", None)  # every record has a loss key; None where the line has none
    return rec


def parse_memory(line: str) -> tuple[int, float] | None:
    """(rank, max allocated GiB) of a report_memory line, else None."""
    m = _MEMORY.search(line)
    if m is None:
        return None
    peak = _fields(m.group(3)).get("max allocated")
    return None if peak is None else (int(m.group(1)), peak * MIB / GIB)


class MegatronLog:
    """Reads a Megatron-LM job's output line by line (``feed``) and appends a step record to
    ``metrics`` for each training_log line. A record's peak memory is the largest report_memory
    figure seen so far, here or in the ``peers`` files: every node's task writes its own largest
    figure to ``own`` as it sees one, since the iteration lines come from the last rank's node only
    and the memory lines from the nodes of the data-parallel rank-0 ranks."""

    def __init__(self, metrics: Path | None, peers: list[Path] | None = None, own: Path | None = None):
        self.metrics = metrics
        self.peers = peers or []
        self.own = own
        self.peak_gib: float | None = None

    def feed(self, line: str) -> dict | None:
        """Take one line; returns the step record it made, if any. A line may carry two reports: the
        ranks share the node's stdout, and an unbuffered print writes its text and its newline in
        two writes, so another rank's text can land between them (seen: an iteration line with rank
        0's memory report after it, on one line, and the iteration lost)."""
        made = [self._feed_one(part) for part in _REPORT_START.split(line) if part.strip()]
        return next((rec for rec in made if rec is not None), None)

    def _feed_one(self, line: str) -> dict | None:
        mem = parse_memory(line)
        if mem is not None:
            if self.peak_gib is None or mem[1] > self.peak_gib:
                self.peak_gib = mem[1]
                if self.own is not None:
                    write_peak(self.own, self.peak_gib)
            return None
        rec = parse_iteration(line)
        if rec is None:
            return None
        peak = max([p for p in [self.peak_gib, *map(read_peak, self.peers)] if p is not None], default=None)
        if peak is not None:
            rec.update(peak_mem_gib=peak, mem_kind=MEM_KIND)
        if self.metrics is not None:
            with open(self.metrics, "a") as fh:
                fh.write(json.dumps(rec) + "\n")
        return rec


def write_peak(path: Path, peak_gib: float) -> None:
    """A node's largest report_memory figure, for the node that writes the records (MegatronLog.peers)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"peak_mem_gib": peak_gib}))
    tmp.replace(path)


def read_peak(path: Path) -> float | None:
    try:
        return float(json.loads(path.read_text())["peak_mem_gib"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def records_of(lines) -> list[dict]:
    """The step records of a whole log (e.g. a finished job's stdout), without writing them."""
    log = MegatronLog(None)
    return [rec for rec in map(log.feed, lines) if rec is not None]
