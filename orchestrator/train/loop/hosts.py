"""Where a SLURM job's master lives: the first node of the allocation, by its NodeAddr.

Standard library only: ``orchestrator.run.jobs`` (the submitit job, on the login node's Python)
and ``orchestrator.train.loop.launch`` (the ranks) both use it. Node names need not resolve in DNS
(the loopback test cluster's do not); ``scontrol show node`` gives the address SLURM itself uses.
launch.sh does the same in shell (templates/launch.sh.j2).
"""

from __future__ import annotations

import re
import shutil
import subprocess


def first_host(nodelist: str) -> str:
    """First host of a SLURM hostlist: "gpu[003-005,9],login1" -> "gpu003"."""
    if shutil.which("scontrol"):
        try:
            out = subprocess.run(
                ["scontrol", "show", "hostnames", nodelist], check=True, capture_output=True, text=True, timeout=30
            ).stdout.split()
            if out:
                return out[0]
        except (OSError, subprocess.SubprocessError):
            pass  # fall back to parsing the common forms ourselves
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist)
    if not m:
        return nodelist
    prefix, ranges = m.group(1), m.group(2)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def node_address(hostname: str) -> str:
    """A SLURM node's NodeAddr (its hostname where scontrol is missing or does not know it)."""
    if shutil.which("scontrol") is None:
        return hostname
    try:
        out = subprocess.run(
            ["scontrol", "show", "node", hostname], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return hostname
    m = re.search(r"NodeAddr=(\S+)", out)
    return m.group(1) if m else hostname


def master_address(nodelist: str) -> str:
    """The address the ranks of a job on ``nodelist`` rendezvous at."""
    return node_address(first_host(nodelist))
