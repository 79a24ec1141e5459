"""dsorch's bundled training entrypoint: TP x PP x DP (ZeRO), and EP for mixture-of-experts
models (train/model/moe.py), with DeepSpeed, driven by a plan.

One process per rank. Everything about the model and the layout comes from the plan directory
(megatron_args.txt, ds_config.json, plan.yaml); the command line only says how long, on what
data and where to write.

    # this machine, 4 CPU ranks over gloo (the plan's launch.sh runs torchrun for you):
    dsorch plan examples/tiny.yaml --cluster local --out plans/tiny
    bash plans/tiny/launch.sh --steps 30 --data examples/data/pydoc

    # the same by hand:
    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 4 \
        -m orchestrator.train --plan plans/tiny --steps 30 --data examples/data/pydoc

    # SLURM, one task per GPU (ranks from SLURM_PROCID/SLURM_LOCALID/SLURM_NTASKS, master from
    # the first host of SLURM_JOB_NODELIST):
    srun --nodes 2 --ntasks-per-node 8 --gpus-per-node 8 \
        python -m orchestrator.train --plan plans/llama8b --steps 1000 --data /data/tokens

    # resume: run the same command again with the same --run-dir (default PLAN_DIR/run); it
    # continues from the newest intact checkpoint in the run directory's checkpoints.

The data is the plan's training.data (the same --data-path Megatron-LM gets); --data overrides
it; with neither the model trains on deterministic synthetic sequences. A resume on other data
than the checkpoint's is refused unless --switch-data says it is meant (train/data/fingerprint.py).
With training.init_from in the spec the model starts from that Hugging Face directory's weights
(train/model/hf_weights.py; `dsorch export-hf RUN_DIR` writes a checkpoint back as one). Rank 0 prints
one line per step and appends it to the run directory's step records (RunDir.metrics), and one
per evaluation of the validation part (every training.data.eval_interval steps,
train/loop/validation.py); TensorBoard and W&B get the same (training.logging, train/loop/sinks.py). The
learning rate follows Megatron-LM's schedule over the plan's steps (train/loop/lr_schedule.py); --steps
past them needs --extend-schedule.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from orchestrator.errors import CheckpointError, SpecError
from orchestrator.plan.layout import Layout
from orchestrator.plandir.reader import PlanDir
from orchestrator.plandir.rundir import RUN_DIR_ENV, STOP_REQUEST_FILE, RunDir
from orchestrator.train.checkpoint import reshard
from orchestrator.train.checkpoint import store as checkpoint
from orchestrator.train.data import fingerprint
from orchestrator.train.data.datasets import micro_batches, open_dataset
from orchestrator.train.loop import launch
from orchestrator.train.loop.config import ds_config, load_plan, stage_layers
from orchestrator.train.loop.lr_schedule import DEFAULT_STEPS, MegatronLR, Schedule, steps_past_plan, steps_to_train
from orchestrator.train.loop.metrics import MetricsLog, peak_memory_gib, peak_reserved_gib
from orchestrator.train.loop.sinks import check_available
from orchestrator.train.loop.validation import evaluate, evaluation_index
from orchestrator.train.model.decoder import DenseModel, LossFn, Pipeline, layer_specs, recompute
from orchestrator.train.model.moe import AuxLossScale, expert_groups
from orchestrator.train.model.tensor_parallel import TPContext
from orchestrator.train.stop import EXIT_STOPPED, OOM_MARK, StopRequest


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m orchestrator.train", description=__doc__.split("\n")[0])
    p.add_argument("--plan", required=True, help="plan directory written by `dsorch plan`")
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"train until this many steps are done (default: the plan's total, else {DEFAULT_STEPS})",
    )
    p.add_argument(
        "--extend-schedule",
        action="store_true",
        help="with --steps past the plan's steps: stretch the learning-rate decay to --steps "
        "(default: refuse, the schedule covers exactly the planned steps)",
    )
    p.add_argument(
        "--data",
        default=None,
        help="Megatron-LM indexed dataset PREFIX (PREFIX.bin + PREFIX.idx, from `dsorch data prepare`), a weighted "
        "list as --data-path takes it ('0.3 a 0.7 b'), or a legacy token file NAME (NAME.bin + NAME.json); "
        "default: the plan's training.data, else synthetic tokens",
    )
    p.add_argument(
        "--switch-data",
        action="store_true",
        help="resume from a checkpoint trained on other data, on purpose (recorded in the next manifest)",
    )
    p.add_argument(
        "--run-dir",
        default=os.environ.get(RUN_DIR_ENV) or None,
        help=f"checkpoints and step records (default ${RUN_DIR_ENV}, else PLAN/run)",
    )
    p.add_argument("--save-interval", type=int, default=0, help="checkpoint every N steps (0: only at the end)")
    p.add_argument("--keep", type=int, default=3, help="checkpoints kept (the newest K)")
    p.add_argument("--no-save", action="store_true", help="write no checkpoint at all")
    p.add_argument(
        "--memory-census",
        default=None,
        metavar="DIR",
        help="after the first step, write each rank's bytes of weights, gradients and optimizer "
        "state, counted tensor by tensor, to DIR/census-rankN.json (train/loop/census.py)",
    )
    p.add_argument(
        "--schedule-census",
        default=None,
        metavar="DIR",
        help="with pp > 1, write each rank's executed pipeline instructions and communication calls, "
        "timed, to DIR/schedule-rankN.json after every step (train/loop/schedule_census.py)",
    )
    # Fault injection for the resume test: SIGKILL rank 0 right after this step is logged.
    p.add_argument("--fail-after-step", type=int, default=None, help=argparse.SUPPRESS)
    # Test pacing for the time-limit test: a floor on the seconds per step, so that how many steps
    # fit into a 2-minute allocation does not depend on the machine's speed. From the environment,
    # because plain `sbatch job.sbatch` passes no arguments.
    p.add_argument(
        "--min-step-seconds",
        type=float,
        default=float(os.environ.get("DSORCH_TEST_MIN_STEP_SECONDS", 0)),
        help=argparse.SUPPRESS,
    )
    # For the equivalence tests: at the end, each rank writes its part of the model whole, by the
    # single-process names, to DIR/weights-rankN.pt (train/model/gather.py).
    p.add_argument("--dump-weights", default=None, metavar="DIR", help=argparse.SUPPRESS)
    # For the weights-in/out tests: after loading (training.init_from or the checkpoint resumed) and at
    # the end, one forward of a fixed batch; the last stage writes its full-vocabulary logits to
    # DIR/logits-stepN.pt (train/model/gather.py dump_logits).
    p.add_argument("--dump-logits", default=None, metavar="DIR", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.keep < 1:
        p.error("--keep must be at least 1")
    return args


def build_engine(
    plan: PlanDir,
    grid,
    topo,
    device,
    load_universal: bool = False,
    aux_scale: AuxLossScale | None = None,
    resuming: bool = False,
    schedule: Schedule | None = None,
):
    """The model as DeepSpeed sees it: a PipelineModule for pp > 1, a plain module for pp = 1.
    ``load_universal``: the checkpoint to resume from is a universal one (reshard.py);
    ``aux_scale``: the MoE layers' auxiliary-loss gradient scale (``aux_loss_scale``);
    ``resuming``: a checkpoint will be loaded, so training.init_from is not read;
    ``schedule``: the learning rate per step (train/loop/lr_schedule.py; default the plan's)."""
    import deepspeed

    lay, training = plan.layout, plan.spec.training
    tp = TPContext(grid.get_slice_parallel_group(), lay.sequence_parallel)
    # Expert parallelism: DeepSpeed's expert groups, made on every rank before any layer is built.
    ep = expert_groups(lay.ep, grid)
    specs = layer_specs(plan.spec.model, training.seq_length, lay, tp, training.seed, ep, aux_scale)
    loss_fn = LossFn(tp)
    if lay.pp > 1:
        # DeepSpeed's pipeline engine runs 1F1B and accepts ZeRO-0/1 only (engine.py asserts
        # stage < 2). Full recomputation is its activation_checkpoint_interval (from ds_config),
        # applied to decoder blocks only, as Megatron's --recompute-granularity full does.
        interval = int(ds_config(plan).get("pipeline", {}).get("activation_checkpoint_interval", 0))
        model: torch.nn.Module = Pipeline(
            specs,
            stage_layers(plan),
            topology=topo,
            loss_fn=loss_fn,
            partition_method="uniform",
            activation_checkpoint_interval=interval if lay.recompute == "full" else 0,
            activation_checkpoint_func=recompute,
            checkpointable_layers=["DecoderLayer"],
        )
        mpu = None  # the PipelineModule brings its own grid
    else:
        model = DenseModel(specs, loss_fn, full_recompute=lay.recompute == "full")
        mpu = grid
    if training.init_from and not resuming:  # before initialize: ZeRO-3 partitions the weights there
        from orchestrator.train.model.hf_weights import load_init_from

        load_init_from(model, plan.spec, tp.rank, tp.size)
    model.to(device)
    config = ds_config_for(plan, device)
    if load_universal:
        # For this resume only: with it on, a native checkpoint does not load (DeepSpeed looks for
        # zero/optimizer_state.pt). Added here, not in the plan, whose ds_config.json is checked.
        config["checkpoint"] = {**config.get("checkpoint", {}), "load_universal": True}
    schedule = schedule or Schedule.of(training)
    engine, *_ = deepspeed.initialize(
        model=model,
        config=config,
        mpu=mpu,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        # DeepSpeed builds it on its own optimizer and steps it after each applied optimizer step.
        lr_scheduler=lambda optimizer: MegatronLR(optimizer, schedule),
    )
    return engine


def ds_config_for(plan: PlanDir, device) -> dict:
    """ds_config.json as DeepSpeed gets it (the plan's, whose sha256 the loader checked), with one
    substitution: on CPU, torch's AdamW. DeepSpeed's default Adam there is its fused C++ op,
    JIT-compiled on first use (~80 s on 2 cores); torch.optim.AdamW computes the same update
    (decoupled weight decay, Loshchilov & Hutter 2019), so unless the plan says otherwise CPU
    runs use it (DeepSpeed's "torch_adam" optimizer parameter). A GPU plan run on CPU gets it too."""
    import copy

    cfg = copy.deepcopy(ds_config(plan))
    opt = cfg.get("optimizer", {})
    if device.type == "cpu" and str(opt.get("type", "")).lower() in ("adam", "adamw"):
        opt.setdefault("params", {}).setdefault("torch_adam", True)
    return cfg


def _experts_text(lay: Layout) -> str:
    return f" (ep {lay.ep}: experts over {lay.ep} dp ranks, expert dp {lay.dp // lay.ep})" if lay.ep > 1 else ""


def aux_loss_scale(engine) -> float:
    """What DeepSpeed multiplies the loss by before backward: 1 / gradient-accumulation steps
    (engine.py backward, scale_wrt_gas), times the fp16 loss scale (its ZeRO and fp16 optimizers'
    ``loss_scale``). The MoE auxiliary loss's gradient is scaled by the same (train/model/moe.py)."""
    scale = float(engine.optimizer.loss_scale) if engine.fp16_enabled() else 1.0
    return scale / engine.gradient_accumulation_steps()


def train_step(engine, batches, pp: int, device, dp_group) -> float:
    """One optimizer step over this rank's micro-batches; returns the global-batch mean loss."""
    if pp > 1:
        return float(engine.train_batch(data_iter=iter(batches)))
    total, n = torch.zeros((), device=device), 0
    for ids, labels in batches:
        loss = engine(ids.to(device, non_blocking=True), labels.to(device, non_blocking=True))
        engine.backward(loss)
        engine.step()  # steps the optimizer only at the gradient-accumulation boundary
        total += loss.detach().float()
        n += 1
    total /= n
    dist.all_reduce(total, group=dp_group)
    return float(total) / dist.get_world_size(dp_group)


def train(plan: PlanDir, args, denv: launch.DistEnv, device: torch.device, stop: StopRequest | None = None) -> bool:
    """Train to args.steps; returns False when a stop request ended it early (checkpoint saved)."""
    trainer = Trainer(plan, args, denv, device, stop)
    for step in range(trainer.start, args.steps):
        if not trainer.step(step):
            return False
    trainer.finish()
    return True


class Trainer:
    """The entrypoint's training loop, a step at a time: ``train`` runs it to the end, and
    scripts/bench_train.py interleaves its steps with a plain DeepSpeed loop's in one process, so
    that what is timed is this code, per-step bookkeeping included."""

    def __init__(
        self, plan: PlanDir, args, denv: launch.DistEnv, device: torch.device, stop: StopRequest | None = None
    ):
        from deepspeed.runtime.pipe.topology import PipelineParallelGrid, PipeModelDataParallelTopology

        lay, training = plan.layout, plan.spec.training
        seq, seed = training.seq_length, training.seed
        self.plan, self.args, self.device, self.stop = plan, args, device, stop
        self.rank0 = rank0 = denv.rank == 0
        if lay.world_size != denv.world_size:
            raise SystemExit(
                f"the plan is for {lay.world_size} ranks (tp {lay.tp} x pp {lay.pp} x dp "
                f"{lay.dp}) but {denv.world_size} were started; launch {lay.world_size} "
                "processes (the plan's launch.sh does) or plan for this world size"
            )
        torch.manual_seed(seed)
        # Ranks are laid out pipe-major, tp-minor (DeepSpeed's PipeModelDataParallelTopology): a tp
        # group is consecutive ranks, i.e. one node's fast interconnect.
        topo = PipeModelDataParallelTopology(num_pp=lay.pp, num_mp=lay.tp, num_dp=lay.dp)
        grid = PipelineParallelGrid(topology=topo)
        self.dp_rank, self.dp_group = grid.get_data_parallel_rank(), grid.get_data_parallel_group()
        self.tp_group, self.rank = grid.get_slice_parallel_group(), denv.rank

        self.rundir = RunDir.for_plan(plan.path, args.run_dir)
        self.run_dir = run_dir = self.rundir.path
        self.ckpt_dir = ckpt_dir = self.rundir.checkpoints
        if rank0:
            run_dir.mkdir(parents=True, exist_ok=True)
        source, blend, self.data_origin = fingerprint.run_data(args.data, training.data, plan.path.resolve())
        vocab, evals = plan.spec.model.vocab_size, training.data.eval_iters > 0
        self.dataset = open_dataset(source, vocab, seq, seed)
        # The validation part, read every data.eval_interval steps (train/loop/validation.py).
        self.valid = open_dataset(source, vocab, seq, seed, split="valid") if evals else None
        self.schedule, schedule_text = run_schedule(training, args)
        try:
            tag, universal = checkpoint.choose_resume(ckpt_dir, rank0, lay.as_dict(), reshard.naming(lay.pp))
        except ValueError as e:
            raise CheckpointError(str(e)) from None
        self._check_data(blend, None if tag is None else ckpt_dir / tag)
        self.aux_scale = AuxLossScale()
        self.engine = engine = build_engine(
            plan,
            grid,
            topo,
            device,
            load_universal=universal,
            aux_scale=self.aux_scale,
            resuming=tag is not None,
            schedule=self.schedule,
        )

        self.start = 0
        if tag is not None:
            self.start = checkpoint.load(engine, ckpt_dir, tag)
            engine.lr_scheduler.set_done(self.start)  # the step resumed from sets the rate
            if rank0 and universal:
                earlier = Layout(**checkpoint.manifest_of(ckpt_dir / tag)["layout"]).short()
                print(
                    f"dsorch train: resuming from {ckpt_dir / tag}, converted from layout {earlier} to {lay.short()}",
                    flush=True,
                )
        self._dump_logits = None
        if args.dump_logits:
            from orchestrator.train.model.gather import dump_logits

            self._dump_logits = functools.partial(dump_logits, engine, plan, grid, device, Path(args.dump_logits))
            self._dump_logits(self.start)
        if rank0:
            # Steps logged after the checkpoint we resume from are redone now: drop their records so
            # that the step records are one trajectory with no gap and no repeated step.
            MetricsLog.truncate(self.rundir, self.start)
            self.rundir.stopped.unlink(missing_ok=True)
        self.stop_file = self.rundir.stop_request

        if rank0:
            self._announce(denv, tag, schedule_text)
        sinks = _sinks(plan, run_dir) if rank0 else None
        self.log = MetricsLog(self.rundir if rank0 else None, plan, denv.world_size, sinks)
        self._pending: _StepFacts | None = None  # the last step's facts, their all-reduce in flight
        self._censuses(args, denv.rank, grid.get_stage_id())

    def _announce(self, denv, tag: str | None, schedule_text: str) -> None:
        """The start of the log: what runs where, the batch arithmetic, the schedule (rank 0)."""
        plan, args, device, run_dir, ckpt_dir = self.plan, self.args, self.device, self.run_dir, self.ckpt_dir
        lay, training, seq = plan.layout, plan.spec.training, plan.spec.training.seq_length
        n_params = sum(p.numel() for p in self.engine.module.parameters())
        dataset = self.dataset
        tokens = lay.global_batch_size * seq
        print(
            f"dsorch train: {plan.spec.name} from {plan.path} on {denv.world_size} ranks "
            f"({denv.launcher}, {device.type}, {training.precision})\n"
            f"  layout: tp {lay.tp} x pp {lay.pp} x dp {lay.dp} = {lay.world_size}{_experts_text(lay)}, "
            f"ZeRO-{lay.zero_stage}, "
            f"sp {'on' if lay.sequence_parallel else 'off'}, recompute {lay.recompute}, "
            f"decoder layers per stage {list(stage_layers(plan))}\n"
            f"  batch:  global {lay.global_batch_size} = micro-batch {lay.micro_batch_size} x "
            f"grad-accum {lay.grad_accum_steps} x dp {lay.dp} sequences of {seq} "
            f"tokens = {tokens:,} tokens/step\n"
            f"  params on rank 0: {n_params:,}; data: {dataset.describe()} (from {self.data_origin})\n"
            f"  lr: {schedule_text}\n"
            + _eval_text(training.data)
            + f"  steps {self.start} -> {args.steps}"
            + (f" (resumed from {ckpt_dir / tag})" if tag else "")
            + f"; run dir {run_dir}",
            flush=True,
        )

    def _check_data(self, blend, tag_dir: Path | None) -> None:
        """Rank 0 fingerprints the data (train/data/fingerprint.py) and compares it with the checkpoint's;
        every rank raises the refusal together (a rank left alone would wait in a collective)."""
        plan, training = self.plan, self.plan.spec.training
        self.data_fp: dict | None = None
        self.data_switched: dict | None = None
        verdict: list[object] = [None]
        if self.rank0:
            self.data_fp = fingerprint.fingerprint(
                blend,
                split=training.data.split,
                tokenizer=training.data.tokenizer,
                base=plan.path.resolve(),
                vocab_size=plan.spec.model.vocab_size,
                seed=training.seed,
            )
            if tag_dir is not None:
                error, self.data_switched, note = fingerprint.resume_check(
                    tag_dir, checkpoint.manifest_of(tag_dir), self.data_fp, self.args.switch_data
                )
                verdict = [error]
                if note:
                    print(f"dsorch train: {note}", flush=True)
        dist.broadcast_object_list(verdict, src=0)
        if verdict[0]:
            raise CheckpointError(str(verdict[0]))

    def _censuses(self, args, rank: int, stage: int) -> None:
        """The tests' hooks: the memory census (bytes per tensor after the first step) and the
        schedule census (the pipeline instructions each rank executes, timed)."""
        if args.memory_census:
            from orchestrator.train.loop.census import census_before_second_step

            census_before_second_step(self.engine, Path(args.memory_census), rank, stage)
        if args.schedule_census and self.plan.layout.pp > 1:
            from orchestrator.train.loop.schedule_census import record_schedule

            record_schedule(self.engine, Path(args.schedule_census), rank)

    def step(self, step: int) -> bool:
        """Run step ``step`` (0-based) and its bookkeeping; False when a stop request ends the run
        after it (its checkpoint saved)."""
        plan, args, device, engine, stop = self.plan, self.args, self.device, self.engine, self.stop
        lay, rank0 = plan.layout, self.rank0
        batches = list(
            micro_batches(self.dataset, step, lay.global_batch_size, lay.micro_batch_size, lay.dp, self.dp_rank)
        )
        if device.type == "cuda":  # page-locked, so the copies to the GPU run asynchronously
            batches = [(ids.pin_memory(), labels.pin_memory()) for ids, labels in batches]
        lr = engine.get_lr()[0]  # the rate this step's update uses
        self.aux_scale.value = aux_loss_scale(engine)
        t0 = time.perf_counter()
        loss = train_step(engine, batches, lay.pp, device, self.dp_group)
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if dt < args.min_step_seconds:
            time.sleep(args.min_step_seconds - dt)
        mem, kind = peak_memory_gib(device)
        # Rank 0 alone looks at the stop-request file: one stat per step on a shared filesystem.
        wanted = stop is not None and stop.requested(self.stop_file if rank0 else None)
        grad_norm = engine.get_global_grad_norm()
        facts = _StepFacts(
            step + 1,
            loss,
            lr,
            None if grad_norm is None else float(grad_norm),
            dt,
            kind,
            peak_reserved_gib(device),
            self.log.clock(),
            torch.tensor([mem, float(wanted)], device=device),
        )
        # One all-reduce (MAX) for two facts: the busiest rank's memory (the one that OOMs) and
        # whether any rank was asked to stop, so that all ranks stop after the same step. It runs
        # while the next step computes and is read after it (one step late), since waiting for it
        # here makes every step a barrier of all ranks: on 4 CPU ranks on 2 cores that wait was
        # about 1 ms a step, some 1-2 % of the tiny model's step (scripts/bench_train.py).
        facts.work = dist.all_reduce(facts.reduced, op=dist.ReduceOp.MAX, async_op=True)
        stop_seen = self._settle(self._pending) if self._pending is not None else False
        self._pending = facts
        done = step + 1
        save_due = not args.no_save and (done == args.steps or (args.save_interval and done % args.save_interval == 0))
        eval_due = self.valid is not None and done % plan.spec.training.data.eval_interval == 0
        if stop_seen or save_due or eval_due or done == args.steps or args.fail_after_step == done:
            # This step's own facts now: its metrics line is written before its checkpoint (a resumed
            # run's step records have no gap), a stop seen now stops now, and the last line is out.
            stop_seen = self._settle(facts) or stop_seen
            self._pending = None
        stopping = stop_seen and done < args.steps
        if eval_due and not stopping:  # a stopping job saves its checkpoint first and at once
            self._evaluate(done, final=False)
        if save_due or (stopping and not args.no_save):
            self._save(done)
        if args.fail_after_step == done and rank0:
            os.kill(os.getpid(), signal.SIGKILL)
        if stopping:
            if rank0:
                # A Trainer given no StopRequest stops only when another rank asked: no signal of its own.
                write_stopped(self.rundir, done, stop.signum if stop is not None else None)
                self.stop_file.unlink(missing_ok=True)  # honoured; a later run must not stop at once
                print(
                    f"dsorch train: stop requested; checkpoint of step {done} saved in {self.ckpt_dir}, "
                    f"exiting with code {EXIT_STOPPED} (rerun to resume)",
                    flush=True,
                )
            return False
        return True

    def _save(self, done: int) -> None:
        """The checkpoint of step ``done``, with what the manifest records: layout, plan, data."""
        plan, lay = self.plan, self.plan.layout
        checkpoint.save(
            self.engine,
            self.ckpt_dir,
            done,
            self.args.keep,
            self.rank0,
            layout=lay.as_dict(),
            plan=str(plan.path.resolve()),
            data=self.data_fp,
            data_switched=self.data_switched,
            # At ep > 1 DeepSpeed saves MoE checkpoints its own way, which reserves the key (and
            # its universal checkpoint cannot convert them: reshard.convertible).
            universal_info=reshard.universal_info(plan.spec.model) if lay.ep == 1 else None,
        )

    def _settle(self, facts: _StepFacts) -> bool:
        """Wait for a step's all-reduce, log the step (rank 0) and apply the memory limit; returns
        whether some rank was asked to stop."""
        # step() sets it right after making the facts; None is only for a rank outside the group.
        assert facts.work is not None
        facts.work.wait()
        busiest, wanted = (float(v) for v in facts.reduced.tolist())
        if self.rank0:
            self.log.record(
                facts.step,
                facts.loss,
                facts.lr,
                facts.grad_norm,
                facts.step_time,
                busiest,
                facts.mem_kind,
                facts.reserved,
                facts.clock,
            )
        limit = self.plan.doc.cluster.gpu_memory_gib
        if self.device.type == "cpu" and busiest > limit:
            # Every rank sees the same maximum, so all leave here together (no rank waits in a
            # collective for a peer that died). stop.py says why this is a fake.
            raise DeviceMemoryExceeded(
                f"{OOM_MARK}: the busiest rank's peak resident set reached "
                f"{busiest:.3f} GiB at step {facts.step}, past the plan's "
                f"cluster.gpu_memory_gib {limit:g} GiB"
            )
        return wanted > 0

    def _evaluate(self, done: int, final: bool) -> None:
        """Validation loss after step ``done`` (train/loop/validation.py), outside the step's timing."""
        data = self.plan.spec.training.data
        t0 = time.perf_counter()
        index = evaluation_index(done, data.eval_interval, final)
        lay = self.plan.layout
        loss = evaluate(self.engine, self.valid, index, data.eval_iters, lay, self.device, self.dp_group, self.dp_rank)
        if self.rank0:
            self.log.record_eval(done, loss, data.eval_iters, time.perf_counter() - t0, final)

    def finish(self) -> None:
        if self._pending is not None:  # the last step settles its own; this is for a loop cut short
            self._settle(self._pending)
            self._pending = None
        planned = self.schedule.decay_steps
        if self.valid is not None and planned is not None and self.args.steps >= planned:
            # Megatron-LM evaluates once more after training (pretrain: if args.do_valid), on the
            # next batches of the validation stream, whether or not the last step was on the
            # interval. Here when the run reaches the end of its schedule: a shorter --steps is a
            # part of the run, as Megatron-LM's --exit-interval is, which exits without it.
            self._evaluate(self.args.steps, final=True)
        self.log.close()
        if self.rank0:
            self.stop_file.unlink(missing_ok=True)  # a request that came with the last step is moot
        if self.args.dump_weights:
            from orchestrator.train.model.gather import dump_weights

            dump_weights(self.engine.module, self.tp_group, Path(self.args.dump_weights), self.rank)
        if self._dump_logits is not None and self.args.steps > self.start:
            self._dump_logits(self.args.steps)


def run_schedule(training, args) -> tuple[Schedule, str]:
    """The run's learning-rate schedule and its line for the log: the plan's, its decay stretched
    to --steps by --extend-schedule (check_steps refuses a longer run without it)."""
    planned = training.train_steps
    if args.extend_schedule and planned is not None and args.steps > planned:
        schedule = Schedule.of(training, decay_steps=args.steps)
        return schedule, f"{schedule.describe()} (extended by --extend-schedule from the plan's {planned} steps)"
    schedule = Schedule.of(training)
    return schedule, schedule.describe()


def _eval_text(data) -> str:
    if data.eval_iters == 0:
        return "  eval: off (data.eval_iters 0)\n"
    return f"  eval: {data.eval_iters} batches of the validation part every {data.eval_interval} steps and at the end\n"


def _sinks(plan: PlanDir, run_dir: Path):
    """TensorBoard / W&B as training.logging selects (train/loop/sinks.py); None when it selects none."""
    logging = plan.spec.training.logging
    if not logging.tensorboard and logging.wandb is None:
        return None
    from orchestrator.train.loop.sinks import Sinks

    config = {"spec": plan.spec.model_dump(mode="json"), "layout": plan.layout.as_dict()}
    return Sinks(logging, run_dir, plan.spec.name, config)


@dataclass
class _StepFacts:
    """What a step's metrics line needs, kept until its all-reduce (``reduced``: this rank's peak
    memory and stop wish, then the maxima over all ranks) has come back."""

    step: int
    loss: float
    lr: float
    grad_norm: float | None
    step_time: float
    mem_kind: str
    reserved: float | None
    clock: tuple[float, float]
    reduced: torch.Tensor
    work: dist.Work | None = None  # the all-reduce of ``reduced``, in flight


class DeviceMemoryExceeded(RuntimeError):
    """The CPU stand-in for torch.OutOfMemoryError (orchestrator/train/stop.py)."""


def write_stopped(run_dir: RunDir, step: int, signum: int | None) -> None:
    import json

    stopped = run_dir.stopped
    tmp = stopped.with_name(stopped.name + ".tmp")
    name = signal.Signals(signum).name if signum else STOP_REQUEST_FILE
    tmp.write_text(json.dumps({"step": step, "signal": name, "time": time.time()}) + "\n", encoding="utf-8")
    os.replace(tmp, stopped)


def check_steps(plan: PlanDir, args) -> None:
    """--steps past the plan's length: refused unless --extend-schedule stretches the decay."""
    problem = steps_past_plan(plan.spec.training, plan.path, args.steps, args.extend_schedule)
    if problem:
        raise SpecError(problem)


def main(argv=None, stop: StopRequest | None = None) -> None:
    stop = stop or StopRequest()
    args = parse_args(argv)
    plan = load_plan(args.plan)
    args.steps = steps_to_train(plan.spec.training, args.steps)
    check_steps(plan, args)
    check_available(plan.spec.training.logging, plan.path)
    denv = launch.read_env()
    device = launch.init(denv, plan.doc.cluster.backend)
    ok = False
    finished = False
    try:
        finished = train(plan, args, denv, device, stop)
        ok = True
    finally:
        launch.teardown(ok, 0 if finished else EXIT_STOPPED)
