"""What hardware (ClusterProfile): shipped and user profiles, ``extends`` resolved."""

from __future__ import annotations

import difflib
import hashlib
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, Field, ValidationError, model_validator

from orchestrator.errors import DsorchError, ProfileNotFound, SpecError
from orchestrator.resources import shipped_profiles_dir
from orchestrator.spec.container import ContainerSpec

# the one reader of sbatch's --time formats
from orchestrator.spec.sbatch import parse_slurm_time
from orchestrator.spec.yamlio import FROZEN, Loaded, deep_merge, format_validation, load_yaml

# --------------------------------------------------------------------------------------------
# Cluster profile
# --------------------------------------------------------------------------------------------

# Bytes in a GB: a profile's GB/s figures (gpu.hbm_bandwidth_gbps, intra_node.bandwidth_gbps,
# filesystem.write_gbps, and ClusterProfile's link shares below) count decimal gigabytes, as vendors
# quote them.
GB = 1e9


def bytes_per_s(gb_per_s):
    """A GB/s figure (or an array of them) in bytes per second."""
    return gb_per_s * GB


# How a job runs: one backend per value in run/backends/ (BACKENDS). A profile names slurm (sbatch)
# or local (processes on this machine, submitit's LocalExecutor); a SLURM profile's job goes
# remote, submitted on its login node over SSH, where its `login:` section applies (run/remote.py
# login_of), and the job registry records it so.
ProfileExecutor = Literal["slurm", "local"]
Executor = Literal[ProfileExecutor, "remote"]
EXECUTORS: tuple[str, ...] = get_args(Executor)


class PeakTflops(BaseModel):
    model_config = FROZEN
    # Dense bf16 peak, TFLOP/s per GPU: the cost model's and MFU's peak at precision bf16.
    bf16: float = Field(gt=0)
    # Dense fp16 peak, TFLOP/s per GPU (precision fp16).
    fp16: float = Field(gt=0)
    # Dense fp32 peak, TFLOP/s per GPU (precision fp32).
    fp32: float = Field(gt=0)
    # Dense FP8 tensor-core peak; None on GPUs without FP8 (before Hopper/Ada).
    fp8: float | None = Field(default=None, gt=0)


class GpuSpec(BaseModel):
    model_config = FROZEN
    # The GPU model (H100-SXM5-80GB, GB200): dsorch's calibration table (costmodel/calibration.yaml) picks
    # its fitted efficiencies by it; plans and `dsorch profiles` show it.
    name: str
    memory_gib: float = Field(gt=0, le=1_000_000)
    # Dense (no 2:4 sparsity) peak, TFLOP/s, per device.
    peak_tflops: PeakTflops
    hbm_bandwidth_gbps: float = Field(default=2000.0, gt=0, description="GB/s")
    # CUDA compute capability ("9.0" Hopper, "10.0" B200/GB200, "10.3" GB300; nvidia-smi
    # --query-gpu=compute_cap prints it). Transformer Engine gates FP8 recipes on it
    # (pytorch/quantization.py: MXFP8 needs 10.0 up to 12.0, block scaling 9.0+); None: unknown.
    compute_capability: str | None = Field(default=None, pattern=r"^\d{1,2}\.\d$")


class IntraNode(BaseModel):
    model_config = FROZEN
    # The link's name (nvlink; shared-memory for the local profile), for people: the cost model reads
    # bandwidth_gbps and latency_us.
    kind: str = "nvlink"
    # Total bidirectional GB/s per GPU as vendors quote it (H100 NVLink 4: 900 GB/s); the cost
    # model uses half of it per direction.
    bandwidth_gbps: float = Field(gt=0)
    latency_us: float = Field(default=5.0, ge=0)
    # GPUs that share one NVLink domain: gpus_per_node (an NVSwitch node) when omitted; 72 on
    # GB200/GB300 NVL72 racks, 18 nodes of 4 GPUs behind NVLink switch trays. Tensor, expert and
    # context parallel groups stay on NVLink while they fit in a domain.
    domain_gpus: int | None = Field(default=None, gt=0, le=1_000_000)


class InterNode(BaseModel):
    model_config = FROZEN
    # The fabric's name (infiniband, loopback): the calibration table matches its entries' inter_node on it.
    kind: str = "infiniband"
    bandwidth_gbps: float = Field(gt=0, description="Gb/s per NIC, per direction")
    # Network adapters per node; a GPU's share of the fabric is bandwidth_gbps / 8 x nics_per_node /
    # gpus_per_node GB/s per direction.
    nics_per_node: int = Field(default=1, gt=0, le=1024)
    latency_us: float = Field(default=10.0, ge=0)


_NO_LINE_BREAKS = r"^[^\n\r\x00]*$"
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class SlurmSpec(BaseModel):
    """SLURM settings. Values end up in #SBATCH lines and shell scripts: they may not contain line
    breaks (a line break would start a new, unquoted shell line), and env names must be valid
    shell variable names. Values are shell-quoted where they reach a shell; `setup` lines are
    shell commands by design and are run as written."""

    model_config = FROZEN
    # #SBATCH --partition; None: the cluster's default partition.
    partition: str | None = None
    # #SBATCH --account to charge; None: the user's default account.
    account: str | None = None
    # #SBATCH --qos (quality of service); None: the default.
    qos: str | None = None
    # #SBATCH --time, the time limit of one allocation (HH:MM:SS or D-HH:MM:SS). SLURM signals the job
    # signal_delay_s before it, the ranks checkpoint and job.sbatch requeues; the plan's checkpoint interval
    # is capped by it.
    time: str = "24:00:00"
    # #SBATCH --constraint: node features the job needs (e.g. a GPU type); None: any node of the partition.
    constraint: str | None = None
    # #SBATCH --exclusive: the job's nodes are shared with no other job.
    exclusive: bool = True
    # CPU cores per rank (per GPU): the job asks for cpus_per_task x gpus_per_node per node (#SBATCH
    # --cpus-per-task), and each rank's OMP_NUM_THREADS on GPUs unless env sets one.
    cpus_per_task: int = Field(default=8, gt=0, le=100_000)
    # #SBATCH --mem, memory per node in SLURM's syntax (e.g. 0 for all of it, 500G); None: the default.
    mem: str | None = None
    # Shell lines the job script runs, in order, before the ranks start (module load, a venv's activate).
    setup: tuple[str, ...] = ()
    # Environment variables exported for every rank (launch.sh and `dsorch submit`'s jobs).
    env: dict[str, str] = {}
    extra: dict[str, str] = Field(default={}, description="extra #SBATCH --key=value pairs")
    # SLURM signals this long before the time limit (and on preemption with a grace time) so that
    # every rank checkpoints before the kill: leave time for one step plus one checkpoint save.
    # SLURM may send it up to a minute early (sbatch(1), --signal).
    signal_delay_s: int = Field(default=90, ge=30, le=65_535)

    @model_validator(mode="after")
    def _safe(self) -> SlurmSpec:
        for key in ("partition", "account", "qos", "time", "constraint", "mem"):
            value = getattr(self, key)
            if value is not None and not re.fullmatch(_NO_LINE_BREAKS, value):
                raise ValueError(f"slurm.{key} contains a line break; write it on one line")
        try:
            parse_slurm_time(self.time)
        except DsorchError as e:
            raise ValueError(f"slurm.time {self.time!r} is not a SLURM time limit; write HH:MM:SS or D-HH:MM:SS") from e
        for i, line in enumerate(self.setup):
            if not re.fullmatch(_NO_LINE_BREAKS, line):
                raise ValueError(f"slurm.setup[{i}] contains a line break; give each command its own list item")
        for k in self.env:
            if not re.fullmatch(_ENV_NAME, k):
                raise ValueError(
                    f"slurm.env key {k!r} is not a valid environment variable name "
                    f"(letters, digits, underscore; not starting with a digit)"
                )
        for k, v in self.extra.items():
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]*", k) or not re.fullmatch(_NO_LINE_BREAKS, v):
                raise ValueError(
                    f"slurm.extra {k!r}: keys are sbatch option names (letters, digits, '-') and "
                    f"values may not contain line breaks"
                )
        return self


class FileSystem(BaseModel):
    """Where checkpoints go: the write bandwidth the whole job gets to the checkpoint directory
    (all ranks together), which prices a checkpoint's write (costmodel/checkpoint.py)."""

    model_config = FROZEN
    # GB/s (1e9 bytes), aggregate. The default is an assumption, not a measurement: one NFS server
    # or a busy parallel file system's share, on the low side of what GPU clusters have so that the
    # checkpoint interval comes out no shorter than it should. Measure yours (e.g. `fio --rw=write
    # --bs=1M --numjobs=<ranks>` from every node at once, or one checkpoint's size over its save time)
    # and set it.
    write_gbps: float = Field(default=5.0, gt=0, le=1_000_000, description="GB/s the job writes in all")


class Reliability(BaseModel):
    """How often a node fails, which sets the job's mean time between failures (node MTBF / nodes)
    and so the checkpoint interval (Young 1974; Daly 2006)."""

    model_config = FROZEN
    # Hours between unexpected interruptions per node. Default: the Llama 3 paper (Dubey et al.
    # 2024, Sec. 3.3.4) reports 419 unexpected interruptions in a 54-day snapshot on 16,384 H100
    # GPUs (2,048 nodes of 8): 54 x 24 x 2,048 / 419 = 6,335 node-hours per failure; rounded down
    # to 5,000 because a cluster less tended than Meta's fails more often.
    node_mtbf_hours: float = Field(default=5000.0, gt=0, le=1_000_000_000, description="hours per node")


class LoginSpec(BaseModel):
    """How a laptop reaches the cluster's login node over OpenSSH (orchestrator/run/remote.py):
    `dsorch submit/status/logs/cancel` then run their SLURM side there. Values reach an ssh command
    line and a remote shell: like ``slurm``'s they may not contain line breaks, and the host may not
    start with '-' (ssh would read it as an option). No password is kept: the key file (or the
    ssh agent) and the host key in known_hosts are what let dsorch in."""

    model_config = FROZEN
    host: str = Field(pattern=r"^(?:[A-Za-z0-9._-]+@)?[A-Za-z0-9._:\[\]-]+$", max_length=300)  # user@host
    # The login node's SSH port (ssh -p).
    port: int = Field(default=22, gt=0, le=65_535)
    identity_file: str | None = None  # None: ssh's own choice (agent, ~/.ssh/config, default keys)
    remote_dir: str  # the experiment directory on the login node; relative paths start at the home
    known_hosts: str | None = None  # None: ssh's own (~/.ssh/known_hosts)
    # The command that runs dsorch on the login node (a venv's bin/dsorch): a shell command line run
    # there as written, as slurm.setup lines are.
    dsorch: str = "dsorch"

    @model_validator(mode="after")
    def _safe(self) -> LoginSpec:
        import re

        if self.host.startswith("-"):
            raise ValueError(f"login.host {self.host!r} starts with '-', which ssh reads as an option; write user@host")
        for key in ("identity_file", "remote_dir", "known_hosts", "dsorch"):
            value = getattr(self, key)
            if value is not None and (not value.strip() or not re.fullmatch(_NO_LINE_BREAKS, value)):
                raise ValueError(f"login.{key} is empty or contains a line break; write it on one line")
        return self


class Efficiency(BaseModel):
    """Free parameters of the time model, physical fractions in [0, 1] (and one stall time).

    A value left out (None) comes from dsorch's calibration table for the profile's GPU and
    interconnect (``orchestrator/costmodel/calibration.yaml``, fitted to published Megatron-LM
    runs by ``scripts/fit_calibration.py``); a value given here overrides it. A profile that
    ``extends`` another inherits the values that one states, like any other key.
    """

    model_config = FROZEN
    # Fraction of dense peak that large GEMMs reach; smaller shapes lose more to their operand
    # traffic (the cost model adds it at the HBM bandwidth below).
    gemm: float | None = Field(default=None, gt=0, le=1)
    # Fraction of dense peak that fused attention kernels (FlashAttention) reach: below large
    # GEMMs, and far below on Hopper for FlashAttention-2 (Shah et al. 2024, FlashAttention-3, Sec. 1:
    # "only 35% utilization" on H100).
    attention: float | None = Field(default=None, gt=0, le=1)
    # Fraction of HBM bandwidth that memory-bound kernels (norms, activations, softmax, optimizer)
    # and GEMM operand traffic reach.
    hbm: float | None = Field(default=None, gt=0, le=1)
    # Fraction of link bandwidth that NCCL collectives reach (bus bandwidth / link bandwidth).
    intra_node_comm: float | None = Field(default=None, gt=0, le=1)
    # Fraction of the NICs' bandwidth (inter_node) that NCCL collectives reach across nodes.
    inter_node_comm: float | None = Field(default=None, gt=0, le=1)
    # Fraction of the data-parallel reduction that overlaps compute where the engine overlaps it
    # (DeepSpeed overlap_comm without pipelining, Megatron --overlap-grad-reduce).
    dp_overlap: float | None = Field(default=None, ge=0, le=1)
    # Where the engine overlaps TP collectives with GEMMs (Megatron-Core --tp-comm-overlap,
    # Transformer Engine userbuffers), the fraction of each paired GEMM's time its collective can
    # hide behind (the GEMM shares its SMs with the copy); unused elsewhere.
    tp_overlap: float | None = Field(default=None, ge=0, le=1)
    # Not a fraction: microseconds each ZeRO-3 per-layer collective stalls the step beyond its
    # transfer time (launch and stream waits between layers), fitted per engine.
    zero3_stall_us: float | None = Field(default=None, ge=0, le=1_000_000)
    # Fraction of dense peak the experts' grouped GEMMs reach (many small GEMMs, one per local
    # expert, in one kernel: Megatron-Core --moe-grouped-gemm); below large dense GEMMs.
    grouped_gemm: float | None = Field(default=None, gt=0, le=1)
    # Fraction of the expert-parallel all-to-all hidden behind another micro-batch's compute where
    # the engine overlaps them (Megatron-Core --overlap-moe-expert-parallel-comm); 0 elsewhere.
    ep_overlap: float | None = Field(default=None, ge=0, le=1)
    # Not a fraction: microseconds of host-side work each MoE layer adds per micro-batch (forward and
    # backward) beyond its kernels: the router and the dispatcher's preprocessing, which reads the
    # tokens per expert back to the host (Megatron-Core token_dispatcher.py, cuda_sync_point), so the
    # launches after it cannot run ahead of the GPU. CUDA graphs of the router and the preprocessing
    # (--cuda-graph-scope moe_router moe_preprocess) remove it. Fitted per engine.
    moe_layer_us: float | None = Field(default=None, ge=0, le=1_000_000)
    # FP8 GEMMs' efficiency relative to the 16-bit GEMMs' of the same kind (a layer's linear GEMMs
    # against ``gemm``, the experts' against ``grouped_gemm``), at the profile's FP8 peak: an FP8
    # GEMM of a shape reaches a smaller fraction of its doubled peak than a bf16 one (torchao
    # moe_training README: MXFP8 grouped GEMMs at 52-66 % of B200's MXFP8 peak).
    fp8_gemm: float | None = Field(default=None, gt=0, le=1)


class Features(BaseModel):
    """Software the cluster's training environment has, where it changes what a plan may use."""

    model_config = FROZEN
    # DeepEP (deepseek-ai/DeepEP): the fused, node-deduplicating MoE dispatch and combine kernels
    # behind Megatron-Core's flex token dispatcher (--moe-token-dispatcher-type flex).
    deepep: bool = False


class ClusterProfile(BaseModel):
    model_config = FROZEN

    # The file's stem. It reaches script headers and directory names: one safe word.
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=200)
    # One line about the hardware, for people: `dsorch profiles` lists it.
    description: str = ""
    # Another profile's name: this file starts from its keys (merged recursively) and overrides them.
    extends: str | None = None
    # How `dsorch submit` runs a job: through SLURM (sbatch), or as processes on this machine
    # (submitit's LocalExecutor; the shipped `local` profile).
    executor: ProfileExecutor = "slurm"
    # Nodes a plan uses (the job's #SBATCH --nodes); `dsorch plan --nodes` overrides it. 1 with the local
    # executor.
    nodes: int = Field(gt=0, le=1_000_000)
    # GPUs per node, one rank each; with the local executor, the number of processes.
    gpus_per_node: int = Field(gt=0, le=1024)
    # The GPU: its name, memory and peak throughput.
    gpu: GpuSpec
    # The link between the GPUs of a node (or of an NVLink domain).
    intra_node: IntraNode
    # The network between nodes.
    inter_node: InterNode
    # torch.distributed backend: nccl on GPUs, gloo for CPU processes (the `local` profile).
    backend: Literal["nccl", "gloo"] = "nccl"
    # CUDA context, NCCL buffers, allocator fragmentation, per GPU.
    memory_overhead_gib: float = Field(default=3.0, ge=0, le=1_000_000)
    # Software the cluster's training environment has (DeepEP).
    features: Features = Features()
    # The time model's efficiencies; each left out comes from dsorch's calibration table.
    efficiency: Efficiency = Efficiency()
    # SLURM settings of the job: #SBATCH options, setup lines, environment.
    slurm: SlurmSpec = SlurmSpec()
    # Run the job step in a container (spec/container.py); None: on the host's Python.
    container: ContainerSpec | None = None
    # The checkpoint directory's write bandwidth, which prices a checkpoint.
    filesystem: FileSystem = FileSystem()
    # Node failure rate, which sets the checkpoint interval.
    reliability: Reliability = Reliability()

    # A laptop's way to the login node: submit, status, logs and cancel over SSH (run/remote.py).
    # How to reach the cluster, not what it is: left out of every dump (plan.yaml's profile), so a
    # plan made on the laptop and on the login node is the same plan.
    login: LoginSpec | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _domain(self) -> ClusterProfile:
        d = self.intra_node.domain_gpus
        if d is not None and (d < self.gpus_per_node or d % self.gpus_per_node):
            raise ValueError(
                f"intra_node.domain_gpus {d} must be a multiple of gpus_per_node {self.gpus_per_node} "
                f"(an NVLink domain is whole nodes); leave it out for one node per domain"
            )
        if self.container is not None and not self.slurm_batch:
            raise ValueError(
                "container: the local executor runs processes on this machine, not through srun; "
                "remove the container section or set executor: slurm"
            )
        return self

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def nvlink_domain(self) -> int:
        """GPUs that reach each other over NVLink: a node, or an NVL72 rack (at most the world)."""
        return min(self.intra_node.domain_gpus or self.gpus_per_node, self.world_size)

    @property
    def one_machine(self) -> bool:
        """Every rank runs on this machine (the local executor): one node, no queue, no time limit."""
        return self.executor == "local"

    @property
    def slurm_batch(self) -> bool:
        """Jobs run as SLURM batch jobs, under slurm.time and its signal before the limit."""
        return self.executor == "slurm"

    @property
    def nvlink_gbs(self) -> float:
        """One direction of a GPU's intra-node link, GB/s: half of intra_node.bandwidth_gbps, the
        bidirectional figure vendors quote. The cost model's NVLink rate (costmodel/links.py) and what
        `dsorch doctor` measures against (run/doctor.py)."""
        return self.intra_node.bandwidth_gbps / 2

    @property
    def nic_share_gbs(self) -> float:
        """A GPU's share of its node's NICs, GB/s in one direction: inter_node.bandwidth_gbps is Gb/s
        per NIC (/ 8), times the node's NICs, over its GPUs. The cost model's inter-node rate and what
        `dsorch doctor` measures against."""
        return self.inter_node.bandwidth_gbps / 8 * self.inter_node.nics_per_node / self.gpus_per_node

    def resized(self, nodes: int | None = None, gpus_per_node: int | None = None) -> ClusterProfile:
        """The same hardware with another node count or fewer GPUs per node (--nodes, --gpus-per-node)."""
        update = {k: v for k, v in (("nodes", nodes), ("gpus_per_node", gpus_per_node)) if v is not None}
        return self.model_copy(update=update) if update else self


# --------------------------------------------------------------------------------------------
# Cluster profiles: shipped ones, user directories, `extends`
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileSource:
    name: str
    path: Path
    origin: str  # "shipped" or "user"


def discover_profiles(profiles_dir: str | Path | None) -> dict[str, ProfileSource]:
    """Every profile by name; a user's profile of the same name wins over a shipped one."""
    found: dict[str, ProfileSource] = {}
    dirs = [(shipped_profiles_dir(), "shipped")]
    if profiles_dir:
        d = Path(profiles_dir)
        if not d.is_dir():
            raise SpecError(
                f"profiles directory {d} does not exist; pass an existing directory to --profiles-dir "
                f"(or DSORCH_PROFILES_DIR)."
            )
        dirs.append((d, "user"))
    for d, origin in dirs:
        for p in sorted(d.glob("*.yaml")):
            found[p.stem] = ProfileSource(p.stem, p, origin)
    return found


@dataclass(frozen=True)
class LoadedProfile:
    profile: ClusterProfile
    source: ProfileSource
    sha256: str  # of the profile file and every file it extends, in order


def load_profile(name: str, profiles_dir: str | Path | None = None) -> LoadedProfile:
    known = discover_profiles(profiles_dir)
    if name not in known:
        close = difflib.get_close_matches(name, list(known), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ProfileNotFound(
            f"unknown cluster profile '{name}'.{hint} Known profiles: {', '.join(sorted(known))}. "
            f"Add your own as NAME.yaml in a directory passed with --profiles-dir or DSORCH_PROFILES_DIR."
        )
    chain: list[Loaded] = []
    seen: list[Path] = []
    src = known[name]
    while True:
        if src.path in seen:
            names = " -> ".join(p.stem for p in [*seen, src.path])
            raise SpecError(f"{known[name].path}: 'extends' forms a cycle: {names}; remove one link.")
        seen.append(src.path)
        loaded = load_yaml(src.path)
        chain.append(loaded)
        parent = loaded.data.get("extends")
        if parent is None:
            break
        if not isinstance(parent, str):
            raise SpecError(
                f"{src.path}:{loaded.lines.get(('extends',), '?')}: key 'extends' must name one profile "
                f"(a string), got {type(parent).__name__}."
            )
        shipped = shipped_profiles_dir() / f"{parent}.yaml"
        if parent == src.name and src.origin == "user" and shipped.exists():
            # A user's profile may extend the shipped profile it overrides (same name).
            src = ProfileSource(parent, shipped, "shipped")
        elif parent in known:
            src = known[parent]
        else:
            raise SpecError(
                f"{src.path}:{loaded.lines.get(('extends',), '?')}: key 'extends' names unknown profile '{parent}'; "
                f"known profiles: {', '.join(sorted(known))}."
            )
    merged: dict = {}
    for loaded in reversed(chain):
        merged = deep_merge(merged, loaded.data)
    merged["name"] = name
    try:
        profile = ClusterProfile.model_validate(merged)
    except ValidationError as e:
        raise SpecError(format_validation(e, chain, ClusterProfile, "cluster profile")) from e
    _check_local_nodes(profile, chain)
    _check_setup_lines(profile, chain)
    digest = (
        hashlib.sha256("".join(ld.sha256 for ld in chain).encode()).hexdigest() if len(chain) > 1 else chain[0].sha256
    )
    return LoadedProfile(profile, known[name], digest)


def _where(chain: list[Loaded], key: tuple) -> str:
    """``file:line`` of the most derived file of an ``extends`` chain that sets ``key``."""
    for ld in chain:
        if key in ld.lines:
            return f"{ld.path}:{ld.lines[key]}"
    return str(chain[0].path)


def check_local_nodes(profile: ClusterProfile, nodes: int | None) -> None:
    """``--nodes N`` on a profile of the local executor, which runs one node (below)."""
    if nodes is not None and nodes > 1 and profile.one_machine:
        raise SpecError(
            f"--nodes {nodes}: profile '{profile.name}' runs on this machine (executor: local), which is one node; "
            f"use --nodes 1 (or leave it out), or a SLURM cluster's profile."
        )


def _check_local_nodes(profile: ClusterProfile, chain: list[Loaded]) -> None:
    """The local executor runs every rank on this machine, one node (run/backends/local.py
    LocalBackend.executor_for gives submitit's LocalExecutor nodes=1): a profile of several local
    nodes would plan for more ranks than its job starts, and fail only at run time."""
    if profile.one_machine and profile.nodes > 1:
        raise SpecError(
            f"{_where(chain, ('nodes',))}: key 'nodes' is {profile.nodes}, but profile '{profile.name}' runs on "
            f"this machine (executor: local, set in {_where(chain, ('executor',))}), which is one node. Set "
            f"nodes: 1 (gpus_per_node is the number of ranks), or executor: slurm for a cluster."
        )


def _check_setup_lines(profile: ClusterProfile, chain: list[Loaded]) -> None:
    """Each slurm.setup line goes into job.sbatch and submitit's script as a line of its own: one
    that is not a complete shell command by itself (a lone quote) breaks both scripts. ``bash -n``
    parses without running anything."""
    bash = shutil.which("bash")
    if bash is None:  # no shell to ask here (the scripts run on the cluster's nodes)
        return
    for i, line in enumerate(profile.slurm.setup):
        r = subprocess.run([bash, "-n"], input=line + "\n", capture_output=True, text=True, check=False)
        if r.returncode != 0:
            # bash's own words without its "PATH: line N: " prefixes (the line numbers are of stdin)
            why = "; ".join(re.sub(r"^.*?: (line \d+: )?", "", e) for e in r.stderr.strip().splitlines())
            raise SpecError(
                f"{_where(chain, ('slurm', 'setup', i))}: key 'slurm.setup[{i}]' ({line!r}) is not a complete shell "
                f"command by itself ({why}); each setup line is written into the job scripts as its own line. "
                f"Close its quotes or brackets, or join a command split over several items into one."
            )
