"""FAKE Megatron-LM `pretrain_gpt.py`, named as a fake: Megatron-LM needs CUDA, which this CPU
machine lacks. It stands in for it in the test that a `--runtime megatron` plan's job.sbatch
requeues itself before its time limit (tests/system/test_slurm.py), and behaves as Megatron-LM does there
(megatron/training/training.py, checkpointing.py, dist_signal_handler.py at d98e8a6):

- reads --save, --load, --train-iters, --save-interval, --exit-signal-handler, --exit-signal from
  the real megatron_args.txt (launch.sh passes it; other flags are accepted and ignored);
- resumes from the iteration in LOAD/latest_checkpointed_iteration.txt, else from 0;
- with --exit-signal-handler, a handler for --exit-signal sets a flag; all ranks agree on it after
  every iteration (an all-reduce, as DistributedSignalHandler.signals_received all-gathers), save a
  checkpoint (rank 0 writes the tracker file last) and exit with code 0;
- saves every --save-interval iterations and at the end.

Rank 0 appends "iteration N" to SAVE/iterations.log for every iteration it trains, so that the
test can check that no iteration is lost or repeated across requeues.

It prints Megatron-LM's log lines in their exact format (training.py training_log: the last rank,
every --log-interval iterations and after the first; utils/common_utils.py report_memory: rank 0,
after the first logged iteration), with FAKE figures: the loss is 10 / (1 + iteration / 10), the
memory is the process's peak resident set, the time is the wall time of the iterations.
"""

import argparse
import os
import resource
import signal
import sys
import time
from datetime import datetime

import torch.distributed as dist


class Log:
    """Megatron-LM's iteration and memory lines, with fake figures (module docstring)."""

    def __init__(self, args, last_rank: bool, rank0: bool, start: int):
        self.args, self.last_rank, self.rank0, self.start = args, last_rank, rank0, start
        self.t0, self.since, self.memory_due = time.perf_counter(), 0, True

    def iteration(self, it: int) -> None:
        self.since += 1
        if it % self.args.log_interval and it != self.start + 1:
            return
        now = time.perf_counter()
        ms = (now - self.t0) * 1000.0 / self.since
        self.t0, self.since = now, 0
        if self.last_rank:
            line = f" [{datetime.now().strftime('%Y-%m-%d %H:%M:%S.%f')}]"
            line += " iteration {:8d}/{:8d} |".format(it, self.args.train_iters)
            line += " consumed samples: {:12d} |".format(it * self.args.global_batch_size)
            line += " elapsed time per iteration (ms): {:.1f} |".format(ms)
            line += f" learning rate: {self.args.lr:.6E} |"
            line += f" global batch size: {self.args.global_batch_size:5d} |"
            line += " {}: {:.6E} |".format("lm loss", 10.0 / (1 + it / 10))
            line += f" loss scale: {1.0:.1f} |"
            line += f" grad norm: {1.0:.3f} |"
            line += " number of skipped iterations: {:3d} |".format(0)
            line += " number of nan iterations: {:3d} |".format(0)
            print(line, flush=True)
        if self.memory_due and self.rank0:
            self.memory_due = False
            mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
            string = f"(after {it} iterations) memory (MB)"
            string += f" | allocated: {mb / 2:.2f} | max allocated: {mb:.2f} | reserved: {mb:.2f} | max reserved: {mb:.2f}"
            print("[Rank {}] {}".format(dist.get_rank(), string), flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--save")
    p.add_argument("--load")
    p.add_argument("--train-iters", type=int, required=True)
    p.add_argument("--save-interval", type=int, default=None)
    p.add_argument("--exit-signal-handler", action="store_true")
    p.add_argument("--exit-signal", default="SIGTERM")
    p.add_argument("--log-interval", type=int, default=100)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--global-batch-size", type=int, default=1)
    args, _ = p.parse_known_args()
    received = []
    if args.exit_signal_handler:
        signal.signal(signal.Signals[args.exit_signal], lambda s, f: received.append(s))
    dist.init_process_group("gloo")
    import torch

    rank0 = dist.get_rank() == 0
    if rank0:
        os.makedirs(args.save, exist_ok=True)
    tracker = os.path.join(args.load, "latest_checkpointed_iteration.txt")
    iteration = int(open(tracker).read()) if os.path.exists(tracker) else 0
    seconds = float(os.environ.get("FAKE_MEGATRON_ITERATION_SECONDS", "0.4"))

    def save(it: int) -> None:
        dist.barrier()
        if rank0:
            tmp = tracker + ".tmp"
            with open(tmp, "w") as fh:
                fh.write(str(it))
            os.replace(tmp, os.path.join(args.save, "latest_checkpointed_iteration.txt"))
        dist.barrier()

    log = Log(args, dist.get_rank() == dist.get_world_size() - 1, rank0, iteration)
    while iteration < args.train_iters:
        time.sleep(seconds)
        iteration += 1
        log.iteration(iteration)
        if rank0:
            with open(os.path.join(args.save, "iterations.log"), "a") as fh:
                fh.write(f"iteration {iteration}\n")
        flag = torch.tensor([1 if received else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            save(iteration)
            if rank0:
                print(f"fake pretrain_gpt: exiting after a checkpoint at iteration {iteration}", flush=True)
            dist.destroy_process_group()
            return 0
        if args.save_interval and iteration % args.save_interval == 0:
            save(iteration)
    save(iteration)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
