"""What every rank of `dsorch doctor`'s job runs: ``python -m orchestrator.run.collectives``, the
child of run/jobs.py ``DoctorJob``, with torch.distributed's variables from SLURM:

1. **Reachability**: an all-reduce over every rank (the sum must be exact), then, up to
   ``PAIRWISE_MAX`` ranks, a message from every rank to every other (world - 1 rounds of shifted
   sends), so a pair that cannot connect is named.
2. **Bandwidth**, in the manner of nccl-tests (its doc/PERFORMANCE.md): all-reduce and all-gather
   over a size sweep, timed as the slowest rank's mean over ``iters`` after warm-up, reported as
   algorithm bandwidth (bytes / time) and bus bandwidth: all-reduce x 2 (n - 1) / n, all-gather
   x (n - 1) / n, which is the per-link figure to set against the hardware. Three groups: every
   rank; each node's ranks (intra-node, every node at once); the ranks of one local index across
   nodes (inter-node, every index at once, as data-parallel traffic crosses nodes).

Rank 0 writes ``doctor.json`` (DOCTOR_RESULT); run/doctor.py reads it on the login side. A module
of its own because it needs torch and the login side does not (pyproject.toml leaves torch to the
user).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from orchestrator.run.jobs import DOCTOR_RESULT

PAIRWISE_MAX = 512  # above this many ranks the pairwise check would open too many connections
WARMUP = 2


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor (doc/PERFORMANCE.md): the bytes each link carries per byte
    of the operation's size."""
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def sizes(max_bytes: int, min_bytes: int = 4096) -> list[int]:
    """Message sizes, x4 apart, from min_bytes to max_bytes (both included)."""
    out, s = [], min_bytes
    while s < max_bytes:
        out.append(s)
        s *= 4
    return out + [max_bytes]


@dataclass(frozen=True, kw_only=True, slots=True)
class _Ranks:
    """The process group as this rank sees it."""

    rank: int
    world: int
    per_node: int  # ranks per node
    nodes: int
    device: torch.device
    gpu: bool

    def sync(self) -> None:
        """Wait for this rank's device: CUDA collectives return before they finish."""
        if self.gpu:
            torch.cuda.synchronize()


def _init() -> _Ranks:
    """Join the process group: nccl on GPUs (DSORCH_DOCTOR_GPU=1, set by DoctorJob), else gloo."""
    gpu = os.environ.get("DSORCH_DOCTOR_GPU") == "1" and torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if gpu:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if gpu else torch.device("cpu")
    dist.init_process_group("nccl" if gpu else "gloo", timeout=timedelta(seconds=180))
    world = dist.get_world_size()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return _Ranks(rank=dist.get_rank(), world=world, per_node=per_node, nodes=world // per_node, device=device, gpu=gpu)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Reach:
    hosts: list[str]  # every rank's host
    allreduce_ok: bool  # the all-reduce over every rank gave the exact sum
    pairwise: bool  # whether every pair was checked (up to PAIRWISE_MAX ranks)
    unreachable: list[list[int]]  # [sender, receiver] of each message that did not arrive


def _reachability(r: _Ranks) -> _Reach:
    host = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    hosts: list = [None] * r.world
    dist.all_gather_object(hosts, host)
    ones = torch.full((1,), float(r.rank + 1), device=r.device)
    dist.all_reduce(ones)
    r.sync()
    allreduce_ok = int(ones.item()) == r.world * (r.world + 1) // 2
    pairwise = r.world <= PAIRWISE_MAX
    return _Reach(
        hosts=hosts, allreduce_ok=allreduce_ok, pairwise=pairwise, unreachable=_unreachable_pairs(r) if pairwise else []
    )


def _unreachable_pairs(r: _Ranks) -> list[list[int]]:
    """[sender, receiver] of every message that did not arrive, as every rank saw it."""
    unreachable: list[list[int]] = []
    # Round k: every rank sends its id to rank + k and receives from rank - k; all pairs in world - 1 rounds.
    for k in range(1, r.world):
        send = torch.full((1,), float(r.rank), device=r.device)
        recv = torch.full((1,), -1.0, device=r.device)
        reqs = [dist.isend(send, (r.rank + k) % r.world), dist.irecv(recv, (r.rank - k) % r.world)]
        for req in reqs:
            # torch types these Work | None: None only for a rank outside the group, and the
            # default group holds every rank.
            assert req is not None
            req.wait()
        r.sync()
        if int(recv.item()) != (r.rank - k) % r.world:
            unreachable.append([(r.rank - k) % r.world, r.rank])
    found: list = [None] * r.world
    dist.all_gather_object(found, unreachable)
    return [pair for part in found for pair in part]


def _groups(r: _Ranks) -> list[tuple[str, object, int]]:
    """(name, process group, ranks in it) of each group the sweep measures. Every rank creates every
    group, in the same order: torch.distributed.new_group is collective over the whole world."""
    node_groups = [dist.new_group(list(range(n * r.per_node, (n + 1) * r.per_node))) for n in range(r.nodes)]
    cross_groups = (
        [dist.new_group([n * r.per_node + i for n in range(r.nodes)]) for i in range(r.per_node)] if r.nodes > 1 else []
    )
    out: list[tuple[str, object, int]] = [("world", None, r.world)]
    if r.per_node > 1:
        out.append(("intra-node", node_groups[r.rank // r.per_node], r.per_node))
    if r.nodes > 1:
        out.append(("inter-node", cross_groups[r.rank % r.per_node], r.nodes))
    return out


def _measure(r: _Ranks, name: str, group, n: int, op: str, size: int, iters: int) -> dict:
    """One row of the sweep: ``op`` over ``group`` (``n`` ranks) at about ``size`` bytes."""
    numel = max(n, size // 4 // n * n)  # float32; all-gather's output divides by n
    nbytes = numel * 4
    if op == "all_reduce":
        buf = torch.ones(numel, device=r.device)

        def run():
            dist.all_reduce(buf, group=group)
    else:
        outp = torch.empty(numel, device=r.device)
        inp = torch.ones(numel // n, device=r.device)
        parts = list(outp.chunk(n))

        def run():
            dist.all_gather(parts, inp, group=group)

    for _ in range(WARMUP):
        run()
    r.sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        run()
    r.sync()
    t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # gloo and nccl both reduce float64 on CPU/GPU
    secs = float(t.item())
    algbw = nbytes / secs / 1e9
    return {
        "group": name,
        "ranks": n,
        "op": op,
        "bytes": nbytes,
        "time_us": round(secs * 1e6, 2),
        "algbw_gbs": round(algbw, 4),
        "busbw_gbs": round(algbw * bus_factor(op, n), 4),
    }


def run_ranks(out: Path, max_bytes: int, iters: int) -> None:
    """This rank's part of the doctor job; rank 0 writes OUT/doctor.json."""
    r = _init()
    reach = _reachability(r)
    results = [
        _measure(r, name, group, n, op, size, iters)
        for name, group, n in _groups(r)
        for op in ("all_reduce", "all_gather")
        for size in sizes(max_bytes)
    ]
    if r.rank == 0:
        doc = {
            "world_size": r.world,
            "nodes": r.nodes,
            "ranks_per_node": r.per_node,
            "backend": "nccl" if r.gpu else "gloo",
            "hosts": sorted(set(reach.hosts)),
            "allreduce_ok": reach.allreduce_ok,
            "pairwise": "checked" if reach.pairwise else f"skipped above {PAIRWISE_MAX} ranks",
            "unreachable": sorted(reach.unreachable),
            "iters": iters,
            "results": results,
        }
        tmp = out / (DOCTOR_RESULT + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(out / DOCTOR_RESULT)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.run.collectives")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-bytes", type=int, required=True)
    ap.add_argument("--iters", type=int, required=True)
    a = ap.parse_args(argv)
    run_ranks(a.out, a.max_bytes, a.iters)


if __name__ == "__main__":
    main()
