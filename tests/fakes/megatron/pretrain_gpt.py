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
"""

import argparse
import os
import signal
import sys
import time

import torch.distributed as dist


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--save")
    p.add_argument("--load")
    p.add_argument("--train-iters", type=int, required=True)
    p.add_argument("--save-interval", type=int, default=None)
    p.add_argument("--exit-signal-handler", action="store_true")
    p.add_argument("--exit-signal", default="SIGTERM")
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

    while iteration < args.train_iters:
        time.sleep(seconds)
        iteration += 1
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
