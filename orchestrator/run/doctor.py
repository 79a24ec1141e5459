"""`dsorch doctor`: one short job that checks the cluster's ranks can reach each other and
measures its collectives, to set against the profile's figures.

Every rank runs ``python -m orchestrator.run.doctor`` (as the child of run/jobs.py ``DoctorJob``, like
the training entrypoint under ``TrainingJob``) with torch.distributed's variables from SLURM:

1. **Reachability**: an all-reduce over every rank (the sum must be exact), then, up to
   ``PAIRWISE_MAX`` ranks, a message from every rank to every other (world - 1 rounds of shifted
   sends), so a pair that cannot connect is named.
2. **Bandwidth**, in the manner of nccl-tests (its doc/PERFORMANCE.md): all-reduce and all-gather
   over a size sweep, timed as the slowest rank's mean over ``iters`` after warm-up, reported as
   algorithm bandwidth (bytes / time) and bus bandwidth: all-reduce x 2 (n - 1) / n, all-gather
   x (n - 1) / n, which is the per-link figure to set against the hardware. Three groups: every
   rank; each node's ranks (intra-node, every node at once); the ranks of one local index across
   nodes (inter-node, every index at once, as data-parallel traffic crosses nodes).

Rank 0 writes ``doctor.json``; the CLI compares it with the profile as the cost model reads it
(``costmodel/evaluate.py``: one direction of NVLink is ``intra_node.bandwidth_gbps / 2`` GB/s,
a GPU's share of the NICs ``inter_node.bandwidth_gbps / 8 x nics_per_node / gpus_per_node``
GB/s) and ``--write`` stores the measured figures in a profile that extends the original.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

RESULT = "doctor.json"
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


# ---- what each rank runs ----------------------------------------------------------------------


def _rank_main(out: Path, max_bytes: int, iters: int) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    gpu = os.environ.get("DSORCH_DOCTOR_GPU") == "1" and torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if gpu:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if gpu else torch.device("cpu")
    dist.init_process_group("nccl" if gpu else "gloo", timeout=timedelta(seconds=180))
    rank, world = dist.get_rank(), dist.get_world_size()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    nodes = world // per_node

    def sync():
        if gpu:
            torch.cuda.synchronize()

    host = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    hosts: list = [None] * world
    dist.all_gather_object(hosts, host)
    ones = torch.full((1,), float(rank + 1), device=device)
    dist.all_reduce(ones)
    sync()
    allreduce_ok = int(ones.item()) == world * (world + 1) // 2
    unreachable: list[list[int]] = []
    pairwise = world <= PAIRWISE_MAX
    if pairwise:
        # Round k: every rank sends its id to rank + k and receives from rank - k; all pairs in world - 1 rounds.
        for k in range(1, world):
            send = torch.full((1,), float(rank), device=device)
            recv = torch.full((1,), -1.0, device=device)
            reqs = [dist.isend(send, (rank + k) % world), dist.irecv(recv, (rank - k) % world)]
            for r in reqs:
                r.wait()
            sync()
            if int(recv.item()) != (rank - k) % world:
                unreachable.append([(rank - k) % world, rank])
        found = [None] * world
        dist.all_gather_object(found, unreachable)
        unreachable = [pair for part in found for pair in part]

    node_groups = [dist.new_group(list(range(n * per_node, (n + 1) * per_node))) for n in range(nodes)]
    cross_groups = ([dist.new_group([n * per_node + i for n in range(nodes)]) for i in range(per_node)]
                    if nodes > 1 else [])
    groups = [("world", None, world)]
    if per_node > 1:
        groups.append(("intra-node", node_groups[rank // per_node], per_node))
    if nodes > 1:
        groups.append(("inter-node", cross_groups[rank % per_node], nodes))
    results = []
    for name, group, n in groups:
        for op in ("all_reduce", "all_gather"):
            for size in sizes(max_bytes):
                numel = max(n, size // 4 // n * n)  # float32; all-gather's output divides by n
                nbytes = numel * 4
                if op == "all_reduce":
                    buf = torch.ones(numel, device=device)

                    def run():
                        dist.all_reduce(buf, group=group)
                else:
                    outp = torch.empty(numel, device=device)
                    inp = torch.ones(numel // n, device=device)
                    parts = list(outp.chunk(n))

                    def run():
                        dist.all_gather(parts, inp, group=group)
                for _ in range(WARMUP):
                    run()
                sync()
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    run()
                sync()
                t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)  # gloo and nccl both reduce float64 on CPU/GPU
                secs = float(t.item())
                algbw = nbytes / secs / 1e9
                results.append({"group": name, "ranks": n, "op": op, "bytes": nbytes, "time_us": round(secs * 1e6, 2),
                                "algbw_gbs": round(algbw, 4), "busbw_gbs": round(algbw * bus_factor(op, n), 4)})
    if rank == 0:
        doc = {"world_size": world, "nodes": nodes, "ranks_per_node": per_node, "backend": "nccl" if gpu else "gloo",
               "hosts": sorted(set(hosts)), "allreduce_ok": allreduce_ok,
               "pairwise": "checked" if pairwise else f"skipped above {PAIRWISE_MAX} ranks",
               "unreachable": sorted(unreachable), "iters": iters, "results": results}
        tmp = out / (RESULT + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(out / RESULT)
    dist.barrier()
    dist.destroy_process_group()


# ---- what the CLI reports ---------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    intra_gbs: float  # one direction of a GPU's intra-node link, GB/s
    inter_gbs: float  # a GPU's share of its node's NICs, GB/s
    intra_latency_us: float
    inter_latency_us: float


def expected(profile) -> Expected:
    """The profile's figures as the cost model reads them (costmodel/evaluate.py _communication)."""
    return Expected(profile.intra_node.bandwidth_gbps / 2,
                    profile.inter_node.bandwidth_gbps / 8 * profile.inter_node.nics_per_node / profile.gpus_per_node,
                    profile.intra_node.latency_us, profile.inter_node.latency_us)


def peak_busbw(doc: dict, group: str) -> float | None:
    """The group's bus bandwidth at large messages: the best of all-reduce and all-gather."""
    rows = [r for r in doc["results"] if r["group"] == group]
    return max((r["busbw_gbs"] for r in rows), default=None)


def latency_us(doc: dict, group: str) -> float | None:
    """Per-hop latency from the smallest all-reduce: a ring all-reduce is 2 (n - 1) hops."""
    rows = [r for r in doc["results"] if r["group"] == group and r["op"] == "all_reduce"]
    if not rows:
        return None
    small = min(rows, key=lambda r: r["bytes"])
    return small["time_us"] / max(1, 2 * (small["ranks"] - 1))


def _sig(x: float) -> float:
    return float(f"{x:.4g}")  # four significant digits: what a sweep of a few repetitions supports


def measured_profile_doc(profile, doc: dict, name: str) -> dict:
    """A profile that extends ``profile`` with the measured figures (only those measured)."""
    out: dict = {"name": name, "extends": profile.name}
    intra, inter = peak_busbw(doc, "intra-node"), peak_busbw(doc, "inter-node")
    if intra is not None:
        out["intra_node"] = {"bandwidth_gbps": _sig(2 * intra), "latency_us": _sig(latency_us(doc, "intra-node"))}
    if inter is not None:
        per_nic_gbit = inter * 8 * profile.gpus_per_node / profile.inter_node.nics_per_node
        out["inter_node"] = {"bandwidth_gbps": _sig(per_nic_gbit), "latency_us": _sig(latency_us(doc, "inter-node"))}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.run.doctor")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-bytes", type=int, required=True)
    ap.add_argument("--iters", type=int, required=True)
    a = ap.parse_args(argv)
    _rank_main(a.out, a.max_bytes, a.iters)


if __name__ == "__main__":
    main()
