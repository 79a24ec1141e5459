"""Stop requests: SIGUSR2 (SLURM's warning before a time limit or preemption) and SIGTERM
(scancel, scontrol requeue). Standard library only, so that ``python -m orchestrator.train`` can
install the handlers before the seconds-long torch/DeepSpeed imports: a signal that arrives
during start-up is remembered instead of killing the rank."""

from __future__ import annotations

import signal


class StopRequest:
    """The training loop checks ``signum`` at every step boundary; all ranks agree through an
    all-reduce and every rank takes part in the checkpoint before leaving."""

    def __init__(self) -> None:
        self.signum: int | None = None
        for sig in (signal.SIGUSR2, signal.SIGTERM):
            signal.signal(sig, self._set)

    def _set(self, signum, frame) -> None:
        self.signum = signum
