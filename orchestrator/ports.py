"""The master port of a job: where rank 0's torch.distributed store listens.

submitit derives it from the job id (``TorchDistributedEnvironment._get_master_port``: a port in
20000-60000 seeded by the job id), which for the local executor is a process id; launch.sh's
torchrun takes 29500 unless told. The first range overlaps Linux's ephemeral ports
(``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default: ip-sysctl.rst), which the
kernel hands to every outgoing connection on the machine, and a fixed port meets the next job on a
shared node, so the store's bind could fail with EADDRINUSE (a raw traceback at run time). A local
job gets a port outside that range that is free when it is submitted (``local_master_port``); a
SLURM job, submitit's or job.sbatch, one that its batch script derives from the job id
(``slurm_master_port_lines``). Both in MASTER_PORT, which submitit and launch.sh take as given.
"""

from __future__ import annotations

import errno
import random
import socket
from pathlib import Path

from orchestrator.errors import JobError

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Linux's default ip_local_port_range, where the file cannot be read.
DEFAULT_EPHEMERAL = (32768, 60999)
# Below this, ports are the registered services' (databases, web servers, ...): not chosen.
LOWEST = 10000
TRIES = 32


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return lo, hi


def _free(port: int) -> bool:
    """Nothing is bound to ``port`` (on any address). A plain bind, without SO_REUSEADDR, also
    fails on a port whose earlier connections linger in TIME_WAIT: such a port is passed over."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def local_master_port(count: int = 1, path: Path = EPHEMERAL_RANGE_FILE, rng: random.Random | None = None) -> int:
    """A port P outside the ephemeral range with P .. P+count-1 all free (a LocalArray's element i
    uses P+i: run/jobs.py); tries others on EADDRINUSE and says so when none is free."""
    lo, hi = ephemeral_range(path)
    candidates = [p for p in range(LOWEST, 65536 - count + 1) if (p + count - 1 < lo or p > hi)]
    if not candidates:
        raise JobError(
            f"{path} gives every port from {lo} to {hi} to outgoing connections, which leaves none for the local "
            f"job's torch.distributed store; narrow it (sysctl net.ipv4.ip_local_port_range) to leave some above "
            f"{LOWEST}."
        )
    rng = rng or random.Random()
    tried = rng.sample(candidates, min(TRIES, len(candidates)))
    for port in tried:
        if all(_free(port + i) for i in range(count)):
            return port
    raise JobError(
        f"no free port for the local job's torch.distributed store: {len(tried)} ports outside the ephemeral range "
        f"{lo}-{hi} ({path}) were all in use (EADDRINUSE). Stop the processes that hold them (`ss -ltn` lists "
        f"them), or wait a minute for closed connections to leave TIME_WAIT, and submit again."
    )


def slurm_master_port_lines() -> list[str]:
    """Bash lines for the batch script of a SLURM job (submitit's setup lines) that export a
    MASTER_PORT outside the ephemeral range, unless the profile sets one. submitit would derive it
    from the job id in 20000-60000 (``_get_master_port``), inside the range, where an outgoing
    connection on the first node may hold it: `bench_chaos` met EADDRINUSE that way on the loopback
    cluster, whose nodes share one host. Every task must agree without talking, so the port is a
    function of the job id and the allocation (SLURM_RESTART_COUNT: a requeued job's store of the
    last allocation may still be closing), read from the first node's own range: the batch script
    runs there, which is where rank 0's store listens, and srun passes the export to every task.
    job.sbatch runs them under ``set -u``, also when bash runs it outside SLURM: no id reads as 0."""
    lo, hi = DEFAULT_EPHEMERAL
    return [
        f"read -r dsorch_lo dsorch_hi < {EPHEMERAL_RANGE_FILE} 2>/dev/null || {{ dsorch_lo={lo}; dsorch_hi={hi}; }}",
        f"if (( dsorch_lo > {LOWEST} + 1000 )); then dsorch_base={LOWEST}; dsorch_span=$((dsorch_lo - {LOWEST}));"
        " else dsorch_base=$((dsorch_hi + 1)); dsorch_span=$((65535 - dsorch_hi)); fi",
        'export MASTER_PORT="${MASTER_PORT:-$((dsorch_base + (${SLURM_JOB_ID:-0} * 7 + ${SLURM_RESTART_COUNT:-0} * 101)'
        ' % dsorch_span))}"',
    ]
