"""Stop requests: SIGUSR2 (SLURM's warning before a time limit or preemption), SIGTERM (scancel,
scontrol requeue, preemption) and the run directory's stop request file (plandir/rundir.py
RunDir.stop_request, what job.sbatch writes when SLURM warns it of the time limit). Standard
library only, so that ``python -m orchestrator.train`` can install the handlers before the
seconds-long torch/DeepSpeed imports: a signal that arrives during start-up is remembered instead
of killing the rank."""

from __future__ import annotations

import signal

# The entrypoint's exit code after every rank has checkpointed on a stop request: rerun to resume.
EXIT_STOPPED = 3
# The entrypoint's exit code when the busiest rank's measured memory passed the plan's device
# memory. A GPU run meets torch.OutOfMemoryError by itself; on a CPU (gloo) run there is no device
# limit, so the entrypoint applies the plan's cluster.gpu_memory_gib to the ranks' peak resident
# set instead: a FAKE out-of-memory, the CPU stand-in, named so in its message (OOM_MARK).
EXIT_OUT_OF_MEMORY = 4
OOM_MARK = "out of memory (CPU stand-in for a GPU's memory limit)"


class StopRequest:
    """The training loop checks ``signum`` at every step boundary; all ranks agree through an
    all-reduce and every rank takes part in the checkpoint before leaving."""

    def __init__(self) -> None:
        self.signum: int | None = None
        for sig in (signal.SIGUSR2, signal.SIGTERM):
            signal.signal(sig, self._set)

    def _set(self, signum, frame) -> None:
        self.signum = signum

    def requested(self, stop_file=None) -> bool:
        """A signal arrived, or ``stop_file`` (a pathlib.Path, checked by the caller's rank) exists."""
        if self.signum is None and stop_file is not None and stop_file.exists():
            self.signum = 0  # 0: requested by file
        return self.signum is not None
