"""The launch edge: the one place the entrypoint reads the environment.

Two launchers are understood:

* torchrun (also what launch.sh runs, one torchrun per node): RANK, LOCAL_RANK, WORLD_SIZE,
  MASTER_ADDR, MASTER_PORT.
* SLURM with one task per GPU (``srun --ntasks-per-node=G python -m orchestrator.train ...``):
  SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS; the master is the NodeAddr of the first host of
  SLURM_JOB_NODELIST (orchestrator/train/loop/hosts.py), the port MASTER_PORT or one derived from
  SLURM_JOB_ID (so that two jobs sharing a node do not collide).

torchrun's variables win when both are present (torchrun started inside an allocation).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from orchestrator.train.loop.hosts import master_address


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    master_addr: str
    master_port: int
    launcher: str  # "torchrun" | "slurm" | "single"


def read_env(environ=None) -> DistEnv:
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return DistEnv(
            int(env["RANK"]),
            int(env.get("LOCAL_RANK", 0)),
            int(env["WORLD_SIZE"]),
            env.get("MASTER_ADDR", "127.0.0.1"),
            int(env.get("MASTER_PORT", 29500)),
            "torchrun",
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        port = int(env.get("MASTER_PORT", 20000 + int(env.get("SLURM_JOB_ID", 0)) % 20000))
        return DistEnv(
            int(env["SLURM_PROCID"]),
            int(env.get("SLURM_LOCALID", 0)),
            int(env["SLURM_NTASKS"]),
            master_address(env.get("SLURM_JOB_NODELIST", "localhost")),
            port,
            "slurm",
        )
    return DistEnv(0, 0, 1, "127.0.0.1", int(env.get("MASTER_PORT", 29500)), "single")


def deepspeed_arch_list(value: str) -> str:
    """TORCH_CUDA_ARCH_LIST as DeepSpeed 0.19's JIT op builder reads it. Its compute_capability_args
    (deepspeed/ops/op_builder/builder.py) takes each entry as digits with an optional "+PTX", so an
    architecture-specific "9.0a" or family-specific "10.0f", which PyTorch's own extension builder
    accepts and CUDA images set, stops FusedAdam's build with int("0a") before the first step (seen
    on an H200 image, docs/measurements/gpu-check-NVIDIA-H200-2026-12-04.yaml). The suffix only
    unlocks instructions (wgmma, tcgen05) that DeepSpeed's optimizer kernels do not use."""
    entries = (e.strip() for e in value.replace(" ", ";").split(";"))
    return ";".join(re.sub(r"^(\d+\.\d+)[af](\+PTX)?$", r"\1\2", e) for e in entries if e)


def init(denv: DistEnv, backend: str) -> torch.device:
    """Start the default process group and bind this rank to its device."""
    if backend == "nccl" and torch.cuda.is_available():
        torch.cuda.set_device(denv.local_rank)
        device = torch.device("cuda", denv.local_rank)
    else:
        device = torch.device("cpu")
        backend = "gloo"
        # One intra-op thread per rank: ranks share the cores, and oversubscription makes a
        # gloo run several times slower.
        torch.set_num_threads(1)
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if device.type == "cuda" else "cpu")
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if device.type == "cuda" and arch and (readable := deepspeed_arch_list(arch)) != arch:
        os.environ["TORCH_CUDA_ARCH_LIST"] = readable
        if denv.rank == 0:
            print(f"TORCH_CUDA_ARCH_LIST {arch!r} -> {readable!r} for DeepSpeed's op builds")
    # DeepSpeed reads these for its own bookkeeping (deepspeed.comm, checkpoint naming).
    for k, v in (
        ("RANK", denv.rank),
        ("LOCAL_RANK", denv.local_rank),
        ("WORLD_SIZE", denv.world_size),
        ("MASTER_ADDR", denv.master_addr),
        ("MASTER_PORT", denv.master_port),
    ):
        os.environ[k] = str(v)
    # env:// rather than tcp://: under torchrun, ranks must join the agent's store
    # (TORCHELASTIC_USE_AGENT_STORE) instead of rank 0 binding MASTER_PORT a second time.
    dist.init_process_group(
        backend, init_method="env://", rank=denv.rank, world_size=denv.world_size, timeout=timedelta(minutes=10)
    )
    import deepspeed  # after DS_ACCELERATOR is set: DeepSpeed picks its accelerator on import

    if device.type == "cpu":
        # DeepSpeed's CPU backend JIT-builds a shared-memory op (ShareMemCommBuilder) in
        # init_distributed, used only by inference_all_reduce (deepspeed/comm/torch.py); training
        # collectives go through torch.distributed (gloo). Its build is ~50 s the first time, and
        # every start takes torch's build lock file for a ninja check: a rank killed in that second
        # (scancel, a preempted job) leaves the lock behind and every later rank on the machine
        # waits for it forever (seen on the loopback cluster). Training never calls it: skip it.
        # (By module name: `import deepspeed.comm.torch as m` would bind the torch library, which
        # deepspeed.comm re-exports under that attribute name.)
        import importlib

        # A module attribute set at run time, which no stub declares.
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # type: ignore[attr-defined]
    deepspeed.init_distributed(dist_backend=backend)
    return device


def teardown(ok: bool, code: int = 0) -> None:
    """Destroy the process group; on success leave without running interpreter shutdown.

    gloo can abort a rank while the interpreter tears down its threads after
    destroy_process_group (seen with DeepSpeed 0.19 / torch 2.x on CPU). A barrier first, so
    no rank leaves while a peer still talks to it, then os._exit(0) once every stream is
    flushed. On failure the exception propagates normally and the launcher sees it.
    """
    if dist.is_available() and dist.is_initialized():
        if ok:
            try:
                dist.barrier()
            except Exception:  # noqa: BLE001 - a dead peer must not hide the real outcome
                ok = False
        dist.destroy_process_group()
    if ok:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
