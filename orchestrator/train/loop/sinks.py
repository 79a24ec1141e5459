"""TensorBoard and Weights & Biases: the step records again, for the tools people look at.

Selected in the spec (training.logging, spec/model.py LoggingSpec); rank 0 writes, as it writes the
run directory's step records (train/loop/metrics.py). Both packages are optional extras:
``pip install 'dsorch[tensorboard]'`` and ``pip install 'dsorch[wandb]'``; a spec that asks for one
that is missing is refused at start on every rank alike (``check_available``), before any rank
waits for another.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from orchestrator.errors import InvalidFile

# Step record keys (train/loop/metrics.py) -> the name each sink shows them under.
SCALARS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "step_time_s": "train/step_time_s",
    "tokens_per_s": "train/tokens_per_s",
    "tflops_per_gpu": "train/tflops_per_gpu",
    "mfu": "train/mfu",
    "peak_mem_gib": "train/peak_mem_gib",
    "peak_reserved_gib": "train/peak_reserved_gib",
    "eval_loss": "eval/loss",
    "eval_ppl": "eval/ppl",
}


def check_available(logging, plan_path) -> None:
    """The extras a spec's training.logging needs, or one error naming the extra to install."""
    wanted = [("tensorboard", "training.logging.tensorboard")] if logging.tensorboard else []
    wanted += [("wandb", "training.logging.wandb")] if logging.wandb is not None else []
    for package, key in wanted:
        if importlib.util.find_spec(package) is None:
            raise InvalidFile(
                f"{plan_path}: {key} is set but the {package} package is not installed here; install it with "
                f"pip install 'dsorch[{package}]' (or drop {key} from the spec and re-plan)"
            )


class Sinks:
    """The sinks a spec selects, written after every step record."""

    def __init__(self, logging, run_dir: Path, run_name: str, config: dict):
        self.tb = self.wandb = None
        if logging.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(run_dir / logging.tensorboard_dir))
        if logging.wandb is not None:
            import wandb

            w = logging.wandb
            # offline: wandb writes the run under dir and never connects (`wandb sync` uploads it);
            # resume "allow" with the run directory's name as id: a resumed run goes on in one W&B run.
            self.wandb = wandb.init(
                project=w.project,
                name=w.name or run_name,
                mode=w.mode,
                dir=str(run_dir / w.dir),
                id=_run_id(run_dir),
                resume="allow",
                config=config,
            )

    def write(self, rec: dict) -> None:
        step = int(rec["step"])
        values = {name: float(rec[k]) for k, name in SCALARS.items() if rec.get(k) is not None}
        if self.tb is not None:
            for name, value in values.items():
                self.tb.add_scalar(name, value, step)
        if self.wandb is not None:
            self.wandb.log(values, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def _run_id(run_dir: Path) -> str:
    """A W&B run id from the run directory (W&B allows letters, digits, - and _)."""
    import hashlib

    name = "".join(c if c.isalnum() or c in "-_" else "-" for c in run_dir.resolve().name)
    return f"{name[:40]}-{hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:8]}"
