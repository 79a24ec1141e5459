"""Validation loss on the data's validation part, as Megatron-LM's --eval-interval/--eval-iters run it.

Megatron-LM (megatron/training/training.py @ d98e8a6) evaluates after every iteration that is a
multiple of --eval-interval (train: ``iteration % args.eval_interval == 0``) and once more after
training ends (pretrain: ``if args.do_valid``), each time on --eval-iters global batches, with
gradients off and the model in eval mode (evaluate). Its validation iterator is not restarted:
each evaluation takes the next --eval-iters batches, and a resumed run skips those the earlier
evaluations took (build_train_valid_test_data_loaders: consumed_valid_samples =
iteration // eval_interval * eval_iters * global batch). So here the k-th evaluation (k = 0, 1,
...; the one after step ``k * eval_interval`` is number k - 1, the final one number
steps // eval_interval) reads validation batches ``k * eval_iters + i``, i < eval_iters: a pure
function of (k, i), the same after a resume and in every layout.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from orchestrator.train.data.datasets import micro_batches


def evaluation_index(done: int, interval: int, final: bool) -> int:
    """Which evaluation runs after step ``done``: the interval's (done // interval - 1) or the
    final one after training (done // interval, the next batches of the same stream)."""
    return done // interval if final else done // interval - 1


def evaluate(engine, dataset, index: int, eval_iters: int, lay, device, dp_group, dp_rank: int) -> float:
    """The mean loss over ``eval_iters`` global validation batches, on every rank alike.

    pp > 1: DeepSpeed's PipelineEngine.eval_batch runs the inference schedule under no_grad,
    averages the last stage's micro-batch losses, all-reduces them over the data-parallel group
    and broadcasts the result to every stage (pipe/engine.py eval_batch, _reduce_outputs with
    reduce_dp, _bcast_pipe_scalar). pp = 1: the same by hand. Neither steps the optimizer or
    touches the gradients, so training goes on as if no evaluation had run."""
    gbs, mbs = lay.global_batch_size, lay.micro_batch_size
    total = torch.zeros((), device=device)
    for i in range(eval_iters):
        batches = micro_batches(dataset, index * eval_iters + i, gbs, mbs, lay.dp, dp_rank)
        if lay.pp > 1:
            # _bcast_pipe_scalar returns a one-element tensor, not a 0-d one.
            total += engine.eval_batch(data_iter=iter(list(batches))).float().to(device).reshape(())
            continue
        engine.eval()
        part, n = torch.zeros((), device=device), 0
        with torch.no_grad():
            for ids, labels in batches:
                part += engine(ids.to(device), labels.to(device)).float()
                n += 1
        dist.all_reduce(part, group=dp_group)
        total += part / (n * dist.get_world_size(dp_group))
    engine.train()
    return float(total) / eval_iters
