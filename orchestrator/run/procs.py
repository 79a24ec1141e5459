"""The process tree below a process, read from Linux's /proc: what a Megatron-LM node task passes
its stop signal on to (run/megatron_job.py) and what `dsorch cancel` of a local job signals
(run/backends/local.py), where neither a process group nor a session reaches every rank.
"""

from __future__ import annotations

from pathlib import Path


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc): torchrun starts each rank in a session of its own
    (torch.distributed.elastic's SubprocessHandler, start_new_session), so neither a process group
    nor a session reaches them from here; under SLURM, slurmstepd signals the whole step's cgroup.
    Also what `dsorch cancel` signals of a local job (run/backends/local.py LocalBackend.cancel)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'.
            ppid = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out
