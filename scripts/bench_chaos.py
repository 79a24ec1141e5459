"""A storm of faults on the loopback SLURM cluster (scripts/slurm-test-cluster.sh): a tiny model trains
on 2 CPU ranks, one on each node, while a seeded chaos driver, at random points of the run, requeues
the job, preempts it (SIGUSR2, and SIGTERM followed by SLURM's requeue), SIGKILLs one rank, drains a
node and restores it, and fills the run directory's disk once (a tmpfs mounted for the run).

    python scripts/bench_chaos.py                 # the short soak: 150 steps, each kind of fault once
    python scripts/bench_chaos.py --long          # 2000 steps, 20 faults
    python scripts/bench_chaos.py --steps 500 --faults 10 --seed 7

The same plan also runs once without faults, next to it. At the end the run must be COMPLETED with
every step exactly once in metrics.jsonl, each step's loss equal to the uninterrupted run's
(deterministic data and seeds), and every checkpoint directory complete (its manifest written and
matching its files: orchestrator/train/checkpoint/store.py damage). Prints the faults survived by kind and
the wall time; exits 1 naming what did not hold.

A killed rank or a full disk fails the job (by design: tests/system/test_faults.py); the driver then
does what a user does, `dsorch submit --resume`, and counts it. The soak drains nodes and requeues
jobs: on the shared cluster run it under `flock /tmp/dsorch-slurm.lock`, or give it a cluster of
its own (DSORCH_SLURM_DIR=/tmp/chaos-slurm DSORCH_SLURM_PORT_BASE=7917, which
scripts/slurm-test-cluster.sh reads; stop it afterwards with the same variables). Must run as root
for the tmpfs; without it the disk-full fault is skipped and the report says so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.plandir.rundir import RunDir

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_SCRIPT = ROOT / "scripts" / "slurm-test-cluster.sh"
DSORCH = str(Path(sys.executable).with_name("dsorch"))
PROFILE = "loopback-2x1"  # tests/profiles: one rank on each of the 2 nodes
LAYOUT = ["--tp", "1", "--pp", "1", "--zero", "1", "--mbs", "4", "--recompute", "none", "--no-sp"]
KINDS = ("requeue", "preempt-usr2", "preempt-term", "kill-rank", "drain-node", "disk-full")
ACTIVE = ("PENDING", "RUNNING", "REQUEUED", "SUBMITTED", "CONFIGURING", "COMPLETING", "RESIZING")
TMPFS_MIB = 256  # the run directory's disk: a few 3.4 MB checkpoints and metrics.jsonl fit many times


class ChaosFailure(AssertionError):
    """A check of the soak did not hold."""


def cluster_env() -> dict[str, str]:
    """Start the loopback cluster (idempotent) and give the environment its clients need."""
    subprocess.run(["bash", str(CLUSTER_SCRIPT), "start"], check=True, capture_output=True, timeout=900)
    out = subprocess.run(["bash", str(CLUSTER_SCRIPT), "env"], check=True, capture_output=True, text=True).stdout
    conf = out.strip().split("=", 1)[1].strip("'\"")
    return dict(
        os.environ,
        SLURM_CONF=conf,
        DSORCH_PROFILES_DIR=str(ROOT / "tests" / "profiles"),
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
    )


def read_steps(run_dir: Path) -> list[dict]:
    """The step records of metrics.jsonl (no "kind"), stopping at a line being written."""
    path = RunDir(run_dir).metrics
    out: list[dict] = []
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            break
        if "kind" not in rec:
            out.append(rec)
    return out


def last_step(run_dir: Path) -> int:
    steps = read_steps(run_dir)
    return steps[-1]["step"] if steps else 0


@dataclass
class Soak:
    """One chaos run: the experiment directory, the plan, the run directory and the driver's tallies."""

    env: dict[str, str]
    exp: Path
    run_dir: Path
    steps: int
    save_interval: int
    rng: random.Random
    log: list[str] = field(default_factory=list)
    survived: Counter = field(default_factory=Counter)
    resubmits: int = 0
    jobs: list[str] = field(default_factory=list)
    best: int = 0  # the furthest step seen so far

    # ---- the cluster and dsorch ---------------------------------------------------------------
    def sh(self, *args, check=True) -> subprocess.CompletedProcess:
        r = subprocess.run(
            list(map(str, args)), env=self.env, cwd=self.exp, capture_output=True, text=True, timeout=900
        )
        if check and r.returncode != 0:
            raise ChaosFailure(f"{' '.join(map(str, args))} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        return r

    def say(self, text: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] step {last_step(self.run_dir):5d}: {text}"
        self.log.append(line)
        print(line, flush=True)

    def submit(self, *extra: str) -> str:
        out = self.sh(DSORCH, "submit", "plans/chaos", "--save-interval", self.save_interval, *extra).stdout
        job = next(ln for ln in out.splitlines() if ln.startswith("submitted job ")).split()[2]
        self.jobs.append(job)
        return job

    @property
    def job(self) -> str:
        return self.jobs[-1]

    def state(self, job: str | None = None) -> str:
        out = self.sh("sacct", "-n", "-X", "-P", "-j", job or self.job, "-o", "State", check=False).stdout.split()
        return out[-1].split()[0].rstrip("+") if out else "UNKNOWN"

    def wait(self, predicate, what: str, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.5)
        raise ChaosFailure(f"timed out after {timeout:.0f} s waiting for {what} (job {self.job}: {self.state()})")

    def recover(self) -> None:
        """A job that ended FAILED (a killed rank, a full disk) is resumed as a user would."""
        state = self.state()
        if state == "FAILED":
            self.resubmits += 1
            self.say(f"job {self.job} FAILED; dsorch submit --resume")
            self.submit("--resume")

    def wait_for_progress(self, gap: int) -> bool:
        """Until the run is `gap` steps past the furthest step seen before (so that faults never starve
        it); resumes failed jobs. False when the run has finished instead."""
        target = min(self.best + gap, self.steps)

        def moved() -> bool:
            self.recover()
            return last_step(self.run_dir) >= target or self.ended()

        self.wait(moved, f"step {target}", timeout=900)
        self.best = max(self.best, last_step(self.run_dir))
        return not self.ended() and self.best < self.steps

    def ended(self) -> bool:
        """The run is over: the current job COMPLETED."""
        return self.state() == "COMPLETED"

    def nodes(self) -> list[str]:
        nodelist = self.sh("squeue", "-h", "-j", self.job, "-o", "%N").stdout.strip()
        if not nodelist:
            return []
        return self.sh("scontrol", "show", "hostnames", nodelist).stdout.split()

    # ---- the faults ---------------------------------------------------------------------------
    def fault_requeue(self) -> str:
        self.sh("scontrol", "requeue", self.job)
        return "scontrol requeue"

    def fault_preempt_usr2(self) -> str:
        # SLURM's warning before a time limit or preemption (--signal=USR2@...), as SLURM sends it to
        # every task; submitit's handler requeues the job after the checkpoint (run/jobs.py).
        self.sh("scancel", "--signal=USR2", self.job)
        return "SIGUSR2 to every task"

    def fault_preempt_term(self) -> str:
        # Preemption with PreemptMode=REQUEUE and a GraceTime (slurm.conf(5) GraceTime): SIGTERM to
        # the tasks at once, then, when the grace time is over, the job is requeued.
        grace = self.rng.uniform(1.0, 4.0)
        self.sh("scancel", "--signal=TERM", self.job)
        time.sleep(grace)
        r = self.sh("scontrol", "requeue", self.job, check=False)
        how = "" if r.returncode == 0 else f" (refused: {r.stderr.strip()})"
        return f"SIGTERM to every task, scontrol requeue {grace:.1f} s later{how}"

    def fault_kill_rank(self) -> str:
        rank = self.rng.randrange(2)
        # A job between allocations has no rank to kill: wait for the next one's ranks, so that the
        # fault is one the run meets (a miss would count as survived without being met).
        self.wait(lambda: self.recover() or self.ended() or rank_pid(self.run_dir, rank) is not None, "a rank", 600)
        pid = rank_pid(self.run_dir, rank)
        if pid is None:  # the run completed first, or the rank ended between the look and now
            return "no rank process to kill (the run had completed or the rank had just exited); nothing killed"
        os.kill(pid, signal.SIGKILL)
        return f"SIGKILL to rank {rank} (pid {pid})"

    def fault_drain_node(self) -> str:
        self.wait(lambda: self.recover() or self.ended() or bool(self.nodes()), "the job's nodes", 600)
        names = self.nodes()
        if not names:
            return "the job holds no node now; nothing drained"
        node = self.rng.choice(names)
        self.sh("scontrol", "update", f"nodename={node}", "state=drain", "reason=dsorch-chaos")
        try:
            # The job keeps its nodes while one drains; its next allocation needs both, so a requeue
            # now waits until the node is back.
            self.sh("scontrol", "requeue", self.job)
            self.wait(lambda: self.state() in ("PENDING", "REQUEUED"), "the requeued job to pend", timeout=120)
            hold = self.rng.uniform(5.0, 10.0)
            time.sleep(hold)
            pending = self.state()
        finally:
            self.sh("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        return f"drained {node}, requeued the job ({pending} for {hold:.1f} s), resumed {node}"

    def fault_disk_full(self) -> str:
        ballast = self.run_dir / "ballast.chaos"
        try:
            fill(ballast)
            hold = self.rng.uniform(3.0, 8.0)
            time.sleep(hold)
            state = self.state()
        finally:
            ballast.unlink(missing_ok=True)
        return f"filled {self.run_dir}'s disk for {hold:.1f} s (job {state} then), freed it"

    def inject(self, kind: str) -> None:
        text = getattr(self, "fault_" + kind.replace("-", "_"))()
        self.survived[kind] += 1
        self.say(f"{kind}: {text}")
        # A job may train on for a few steps after the fault before it fails (the full disk stops
        # it at its next write): the next fault waits for progress past those steps, not past the
        # steps before this fault, or it would land while the run is between jobs.
        self.best = max(self.best, last_step(self.run_dir))


def rank_pid(run_dir: Path, rank: int) -> int | None:
    """The training process (`python -m orchestrator.train`) of ``rank`` of the run in ``run_dir``:
    the nodes are loopback, so every rank is a process of this machine."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            env = dict(kv.split(b"=", 1) for kv in (proc / "environ").read_bytes().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if b"orchestrator.train" in cmd and str(run_dir).encode() in cmd and env.get(b"RANK") == str(rank).encode():
            return int(proc.name)
    return None


def fill(ballast: Path) -> None:
    """Write zeros into ``ballast`` until the file system is full."""
    chunk = b"\0" * (1 << 20)
    with open(ballast, "wb", buffering=0) as fh:
        with contextlib.suppress(OSError):  # ENOSPC: full
            while True:
                fh.write(chunk)
        small = b"\0" * 4096
        with contextlib.suppress(OSError):
            while True:
                fh.write(small)


@contextlib.contextmanager
def tmpfs(path: Path, mib: int):
    """``path`` on a tmpfs of ``mib`` MiB (root only); yields whether it is one."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(path)], capture_output=True)
    try:
        yield r.returncode == 0
    finally:
        if r.returncode == 0:
            subprocess.run(["umount", "-l", str(path)], check=False)


def schedule(rng: random.Random, faults: int, kinds: tuple[str, ...], disk_full: bool) -> list[str]:
    """``faults`` of ``kinds`` in random order: every kind once first (the disk filled once only),
    then any kind but disk-full."""
    kinds = tuple(k for k in kinds if disk_full or k != "disk-full")
    first = rng.sample(kinds, len(kinds))
    rest = [rng.choice([k for k in kinds if k != "disk-full"]) for _ in range(max(0, faults - len(first)))]
    return (first + rest)[:faults]


def plan(env: dict[str, str], exp: Path, steps: int) -> None:
    spec = exp / "tiny-chaos.yaml"
    spec.write_text((ROOT / "examples" / "tiny.yaml").read_text().replace("train_tokens: 30720", f"steps: {steps}"))
    for out in ("plans/chaos", "plans/calm"):
        subprocess.run(
            [DSORCH, "plan", str(spec), "--cluster", PROFILE, "--out", out, *LAYOUT],
            env=env,
            cwd=exp,
            check=True,
            capture_output=True,
        )


@dataclass
class Report:
    steps: int
    seed: int
    drawn: int  # faults the schedule drew; fewer land when the run ends first
    survived: Counter
    resubmits: int
    starts: int  # allocations that started training (RUN_DIR/starts.jsonl)
    jobs: list[str]
    wall_s: float
    disk_full_possible: bool
    max_rel_loss_diff: float
    problems: list[str]

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {self.survived[k]}" for k in KINDS)
        lines = [
            f"{self.steps} steps, seed {self.seed}: {sum(self.survived.values())} of {self.drawn} faults "
            f"survived ({kinds}) "
            f"in {self.wall_s:.0f} s wall time",
            f"  {self.starts} starts of training over {len(self.jobs)} job(s) ({self.resubmits} resubmitted with "
            f"--resume after a failure); largest relative loss difference to the run without faults "
            f"{self.max_rel_loss_diff:.2e}",
        ]
        if not self.disk_full_possible:
            lines.append("  disk-full skipped: no tmpfs could be mounted for the run directory (not root?)")
        lines += [f"  PROBLEM: {p}" for p in self.problems] or ["  every check held"]
        return "\n".join(lines)


def check(soak: Soak, calm_run: Path, calm_state: str) -> tuple[list[str], float]:
    """What the soak promises, as a list of what did not hold; and the largest relative loss gap."""
    from orchestrator.train.checkpoint.store import damage

    problems = []
    state = soak.state()
    if state != "COMPLETED" or calm_state != "COMPLETED":
        problems.append(f"the chaos job ended {state}, the calm one {calm_state}")
    got, calm = read_steps(soak.run_dir), read_steps(calm_run)
    if [r["step"] for r in got] != list(range(1, soak.steps + 1)):
        seen = Counter(r["step"] for r in got)
        problems.append(
            f"metrics.jsonl has {len(got)} step records for {soak.steps} steps: repeated "
            f"{sorted(s for s, n in seen.items() if n > 1)[:10]}, missing "
            f"{sorted(set(range(1, soak.steps + 1)) - set(seen))[:10]}"
        )
    if [r["step"] for r in calm] != list(range(1, soak.steps + 1)):
        problems.append(f"the run without faults logged {len(calm)} steps, not {soak.steps}")
    rel = [abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(got, calm, strict=False)]
    worst = max(rel, default=math.inf)
    if got and calm and not math.isclose(got[-1]["loss"], calm[-1]["loss"], rel_tol=1e-6):
        problems.append(f"final loss {got[-1]['loss']!r}, the run without faults {calm[-1]['loss']!r}")
    if worst > 1e-6:
        problems.append(f"a step's loss differs from the run without faults by {worst:.2e} (relative)")
    ckpt = RunDir(soak.run_dir).checkpoints
    for tag_dir in sorted(p for p in ckpt.iterdir() if p.is_dir()) if ckpt.is_dir() else []:
        why = damage(tag_dir)
        if why is not None:
            problems.append(f"checkpoint {tag_dir.name} left half-written: {why}")
    leftovers = sorted(str(p.relative_to(soak.run_dir)) for p in soak.run_dir.rglob("*") if p.name.endswith(".tmp"))
    if leftovers:
        problems.append(f"temporary files left in the run directory: {leftovers[:10]}")
    return problems, worst


def run_soak(
    env: dict[str, str], steps: int, faults: int, seed: int, save_interval: int, kinds: tuple[str, ...] = KINDS
) -> Report:
    """Train ``steps`` steps through ``faults`` faults of ``kinds`` (and the same plan without faults
    next to it)."""
    rng = random.Random(seed)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dsorch-chaos-") as tmp:
        exp = Path(tmp)
        plan(env, exp, steps)
        run_dir, calm_run = exp / "chaos-run", exp / "calm-run"
        with tmpfs(run_dir, TMPFS_MIB) as on_tmpfs:
            soak = Soak(env=env, exp=exp, run_dir=run_dir, steps=steps, save_interval=save_interval, rng=rng)
            out = soak.sh(DSORCH, "submit", "plans/calm", "--save-interval", save_interval, "--run-dir", calm_run)
            calm_job = out.stdout.split()[2]
            soak.submit("--run-dir", str(run_dir))
            drawn = schedule(rng, faults, kinds, disk_full=on_tmpfs)
            try:
                for i, kind in enumerate(drawn):
                    # Gaps of 2 steps up to an even share of the steps still ahead: every fault lands
                    # before the end, also when a fault lets the run train on (a full disk fails the
                    # job only at its next write; a fast machine trains many steps per poll).
                    spread = max(2, (steps - soak.best) // (len(drawn) - i + 1))
                    if not soak.wait_for_progress(rng.randint(2, spread)):
                        break
                    time.sleep(rng.uniform(0.0, 1.5))  # anywhere in a step or a checkpoint
                    soak.inject(kind)
                soak.wait(
                    lambda: soak.recover() or (soak.ended() and last_step(run_dir) >= steps),
                    "the chaos job to complete",
                    timeout=900,
                )
                soak.wait(lambda: soak.state(calm_job) not in ACTIVE, "the calm job to end", timeout=900)
            finally:
                for job in (calm_job, *soak.jobs):
                    soak.sh("scancel", job, check=False)  # nothing, unless a check above gave up
            problems, worst = check(soak, calm_run, soak.state(calm_job))
            starts = (
                len(RunDir(run_dir).starts.read_text().splitlines()) if RunDir(run_dir).starts.exists() else 0
            )
    return Report(
        steps=steps,
        seed=seed,
        drawn=len(drawn),
        survived=soak.survived,
        resubmits=soak.resubmits,
        starts=starts,
        jobs=soak.jobs,
        wall_s=time.monotonic() - t0,
        disk_full_possible=on_tmpfs,
        max_rel_loss_diff=worst,
        problems=problems,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--long", action="store_true", help="2000 steps and 20 faults (the figure in the README)")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default 150; --long 2000)")
    ap.add_argument("--faults", type=int, default=None, help=f"faults to inject (default {len(KINDS)}; --long 20)")
    ap.add_argument("--seed", type=int, default=0, help="the chaos driver's random seed")
    ap.add_argument("--save-interval", type=int, default=10, help="checkpoint every N steps")
    ap.add_argument(
        "--kinds", default=",".join(KINDS), help=f"the kinds of fault, comma-separated (default all: {','.join(KINDS)})"
    )
    args = ap.parse_args()
    # SIGTERM (kill, timeout) unwinds like an exception: the finally blocks resume a drained node,
    # cancel the jobs and unmount the tmpfs.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    kinds = tuple(args.kinds.split(","))
    if unknown := sorted(set(kinds) - set(KINDS)):
        ap.error(f"--kinds: unknown {', '.join(unknown)}; the kinds are {', '.join(KINDS)}")
    steps = args.steps or (2000 if args.long else 150)
    faults = args.faults if args.faults is not None else (20 if args.long else len(kinds))
    cmd = " ".join(["python", "scripts/bench_chaos.py", *sys.argv[1:]])
    print(f"{cmd}: {steps} steps, {faults} faults, seed {args.seed}, checkpoint every {args.save_interval} steps")
    report = run_soak(cluster_env(), steps, faults, args.seed, args.save_interval, kinds)
    print(report.summary())
    sys.exit(1 if report.problems else 0)


if __name__ == "__main__":
    main()
