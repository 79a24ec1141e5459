"""`dsorch doctor`: one short job that checks the cluster's ranks can reach each other and
measures its collectives, to set against the profile's figures.

Every rank runs ``python -m orchestrator.run.collectives`` (the reachability check and the
nccl-tests style sweep; run/collectives.py says how) as the child of run/jobs.py ``DoctorJob``.
This module is the login side: it submits the job (``submit_checks``), reports its state for
the CLI's polling (``check_state``) and its result (``checks_result``), compares what rank 0
wrote into ``doctor.json`` with the profile as the cost model reads it (``ClusterProfile.nvlink_gbs``:
one direction of NVLink is ``intra_node.bandwidth_gbps / 2`` GB/s; ``nic_share_gbs``, a GPU's share of
the NICs, ``inter_node.bandwidth_gbps / 8 x nics_per_node / gpus_per_node`` GB/s) and, for ``--write``,
stores the measured figures in a profile that extends the original (``write_measured_profile``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from orchestrator.errors import JobError
from orchestrator.run.backends import Backend, JobSpec, backend_for
from orchestrator.run.jobs import DOCTOR_RESULT, DoctorJob
from orchestrator.run.trial import PROFILE_HEADER, check_profile_name, write_profile
from orchestrator.spec.cluster import ClusterProfile, check_local_nodes
from orchestrator.spec.sbatch import job_name

# The states of a job that has not ended yet, in SLURM's names (squeue(1), JOB STATE CODES).
WAITING = ("SUBMITTED", "PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING")


# ---- submit and wait --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class DoctorSubmission:
    job_id: str
    profile: ClusterProfile  # resized to the nodes checked
    backend: Backend  # the profile's scheduler: the job's state, its cancellation
    folder: Path  # submitit's folder: logs, and the ranks' doctor.json
    timeout_min: int
    submitted_at: float  # time.time() at submission: the deadline counts from it


def submit_checks(
    root: Path,
    profile: ClusterProfile,
    *,
    nodes: int | None,
    max_size_mib: int | None,
    iters: int | None,
    timeout_min: int,
) -> DoctorSubmission:
    """Queue the doctor job on ``nodes`` nodes of ``profile`` (default all), its files under
    ROOT/.dsorch/doctor/. Messages up to ``max_size_mib`` MiB (default 256 on GPUs, 16 on CPU
    ranks), ``iters`` timed repetitions per size (default 20 on GPUs, 5 on CPU ranks)."""
    check_local_nodes(profile, nodes)
    profile = profile.resized(nodes, None)
    spec = JobSpec.of(profile, job_name(f"doctor-{profile.name}"), time_min=timeout_min)
    backend = backend_for(spec)
    backend.check()
    gpu = profile.backend == "nccl"
    max_bytes = (max_size_mib or (256 if gpu else 16)) * 1024 * 1024
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    folder = (root / ".dsorch" / "doctor" / f"{profile.name}-{stamp}").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    job = DoctorJob(str(folder), max_bytes, iters or (20 if gpu else 5), gpu)
    job_id = backend.submit(spec, folder, job)
    return DoctorSubmission(
        job_id=job_id,
        profile=profile,
        backend=backend,
        folder=folder,
        timeout_min=timeout_min,
        submitted_at=time.time(),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckState:
    state: str  # SLURM's name for it
    error: str | None  # the failure the scheduler reported, once the job ended badly

    @property
    def waiting(self) -> bool:
        return self.state in WAITING


def check_state(sub: DoctorSubmission, last: CheckState | None) -> CheckState:
    """The doctor job's state now (the CLI polls this); a job still queued or running a minute
    past its time limit is cancelled, and that is an error."""
    state, error = sub.backend.state(sub.folder, sub.job_id, last.state if last else "PENDING")
    if state in WAITING and time.time() > sub.submitted_at + 60 * sub.timeout_min + 60:
        sub.backend.cancel(sub.job_id)
        raise JobError(
            f"the doctor job {sub.job_id} did not finish within --timeout {sub.timeout_min} min; "
            f"it was cancelled. Is the partition busy? Try again with a larger --timeout."
        )
    return CheckState(state=state, error=error)


def checks_result(sub: DoctorSubmission, end: CheckState, shown_folder: str) -> dict:
    """What rank 0 wrote (doctor.json) once the job ended; ``shown_folder`` is the job's folder as
    the user reads it, for the errors."""
    result = sub.folder / DOCTOR_RESULT
    if end.state != "COMPLETED" or not result.is_file():
        raise JobError(
            f"the doctor job {sub.job_id} ended {end.state}"
            + (f":\n{end.error}" if end.error else "")
            + f"\nIts logs: {shown_folder}. A rank that cannot reach another fails at rendezvous or at "
            f"the first collective; the log of the rank that failed first names it."
        )
    return json.loads(result.read_text())


def healthy(doc: dict) -> bool:
    """Every rank reached every other: the all-reduce was exact and no pair failed."""
    return doc["allreduce_ok"] and not doc["unreachable"]


# ---- compare with the profile -----------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    intra_gbs: float  # one direction of a GPU's intra-node link, GB/s
    inter_gbs: float  # a GPU's share of its node's NICs, GB/s
    intra_latency_us: float
    inter_latency_us: float


def expected(profile) -> Expected:
    """The profile's figures as the cost model reads them (costmodel/links.py _links)."""
    return Expected(
        profile.nvlink_gbs,
        profile.nic_share_gbs,
        profile.intra_node.latency_us,
        profile.inter_node.latency_us,
    )


def peak_busbw(doc: dict, group: str) -> float | None:
    """The group's bus bandwidth at large messages: the best of all-reduce and all-gather."""
    rows = [r for r in doc["results"] if r["group"] == group]
    return max((r["busbw_gbs"] for r in rows), default=None)


def latency_us(doc: dict, group: str) -> float | None:
    """Per-hop latency from the smallest all-reduce: a ring all-reduce is 2 (n - 1) hops."""
    rows = [r for r in doc["results"] if r["group"] == group and r["op"] == "all_reduce"]
    if not rows:
        return None
    small = min(rows, key=lambda r: r["bytes"])
    return small["time_us"] / max(1, 2 * (small["ranks"] - 1))


# ---- the measured profile ---------------------------------------------------------------------


def _sig(x: float) -> float:
    return float(f"{x:.4g}")  # four significant digits: what a sweep of a few repetitions supports


def _link(bandwidth_gbps: float, latency: float | None) -> dict[str, float]:
    """A link's measured figures. collectives.py sweeps all-reduce over every group it measures, so
    a latency is there wherever a bandwidth is; a doctor.json without one gives the bandwidth only."""
    link = {"bandwidth_gbps": _sig(bandwidth_gbps)}
    if latency is not None:
        link["latency_us"] = _sig(latency)
    return link


def measured_profile_doc(profile, doc: dict, name: str) -> dict:
    """A profile that extends ``profile`` with the measured figures (only those measured)."""
    out: dict = {"name": name, "extends": profile.name}
    intra, inter = peak_busbw(doc, "intra-node"), peak_busbw(doc, "inter-node")
    # The inverses of ClusterProfile.nvlink_gbs and nic_share_gbs: the profile's own units.
    if intra is not None:
        out["intra_node"] = _link(2 * intra, latency_us(doc, "intra-node"))
    if inter is not None:
        per_nic_gbit = inter * 8 * profile.gpus_per_node / profile.inter_node.nics_per_node
        out["inter_node"] = _link(per_nic_gbit, latency_us(doc, "inter-node"))
    return out


def write_measured_profile(
    project, profiles_dir: str | None, profile: ClusterProfile, doc: dict, job_id: str, name: str | None
) -> Path:
    """Store the figures of job ``job_id`` as the profile ``name`` (default <profile>-doctor), which
    extends ``profile``, in the profiles directory in use (trial.write_profile)."""
    name = name or f"{profile.name}-doctor"
    check_profile_name(name)
    text = (
        f"{PROFILE_HEADER} doctor` from job {job_id}: {doc['world_size']} ranks on {doc['nodes']} node(s), "
        f"{doc['backend']}.\n# Bandwidths are the measured bus bandwidth at large messages in the profile's "
        f"units; latencies from the smallest all-reduce.\n"
        + yaml.safe_dump(measured_profile_doc(profile, doc, name), sort_keys=False)
    )
    return write_profile(project, profiles_dir, name, text)
