#!/usr/bin/env python3
"""Fuzz dsorch with hostile and broken input, the way an adversary or a careless user would.

    python scripts/fuzz.py --n 10000 [--seed 0] [--kinds spec,profile,flags,plandir,registry]

Each case builds one input in a fresh directory and runs the real `dsorch` command on it
(in-process, through click): a mutated example spec or cluster profile (values replaced by
line breaks, shell syntax, huge or negative numbers, NaN, deep nesting, aliases; lines deleted or
duplicated), random `plan` flags and odd `--out` paths, a damaged plan directory (files truncated,
garbled, deleted, replaced by directories, hashes edited), or a damaged job registry. It records:

  traceback    the command raised instead of printing one paragraph (any exit but 0, 1 or 2, or
               an exception that is not click's)
  hang         one case took longer than --timeout seconds
  blow-up      more than 64 KB of output
  unparseable  a generated job.sbatch or launch.sh that `bash -n` rejects
  injection    a canary file appeared: a value ran as a command when job.sbatch ran (with FAKE
               srun, scontrol and torchrun that record and exec their arguments, as in
               tests/system/test_hostile.py) or when dsorch ran
  leftover     a failed `plan` left its --out directory, a temporary file, or created parents

and prints the counts per class with the first examples, exit 1 if any. tests/system/test_fuzz.py runs
a bounded number of cases of every kind in the test suite.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DS_ACCELERATOR", "cpu")

KINDS = ("spec", "profile", "flags", "plandir", "registry")
CANARY = "DSORCH_FUZZ_CANARY"


def hostile_values(canary: Path) -> list:
    c = str(canary)
    return [
        f"x\ntouch {c}", f"x\ntouch {c}\n", f"$(touch {c})", f"`touch {c}`", f"x; touch {c} #", f"'; touch {c}; '",
        f'"; touch {c}; "', "a\rb", "", " ", "\t", "x" * 5000, "ünïcødé", "../../etc/passwd", "-", "--help",
        0, -1, 1, 2, 3, 7, 1e308, -1e308, 10**30, 0.5, float("nan"), float("inf"), True, None, [], {}, [1, [2, [3]]],
        {"a": {"b": {"c": 1}}}, "1e999", "0x10", "null",
    ]


@dataclass
class Report:
    cases: int = 0
    problems: dict[str, list[str]] = field(default_factory=dict)

    def add(self, kind: str, detail: str) -> None:
        self.problems.setdefault(kind, []).append(detail)

    @property
    def ok(self) -> bool:
        return not self.problems


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _invoke(args: list[str], cwd: Path, timeout: float, env: dict | None = None):
    """Run `dsorch ARGS` in-process in ``cwd``; (exit code, output, exception or None, seconds)."""
    from click.testing import CliRunner

    from orchestrator.cli.main import main

    old = os.getcwd()
    os.chdir(cwd)
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    t0 = time.monotonic()
    try:
        r = CliRunner().invoke(main, args, env=env, catch_exceptions=True)
        return r.exit_code, r.output, r.exception, time.monotonic() - t0
    except _Timeout:
        return None, "", _Timeout(), time.monotonic() - t0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        os.chdir(old)


def _check_run(report: Report, label: str, res) -> bool:
    code, out, exc, secs = res
    if isinstance(exc, _Timeout):
        report.add("hang", f"{label}: over the time limit")
        return False
    if exc is not None and not isinstance(exc, SystemExit):
        report.add("traceback", f"{label}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
        return False
    if code not in (0, 1, 2):
        report.add("traceback", f"{label}: exit code {code}")
        return False
    if "Traceback (most recent call last)" in out:
        report.add("traceback", f"{label}: a traceback in the output")
    if len(out) > 64 * 1024:
        report.add("blow-up", f"{label}: {len(out):,} bytes of output")
    return code == 0


def _fakes(bin_dir: Path, record: Path) -> None:
    """FAKE srun, scontrol and torchrun: record their arguments; srun runs its command."""
    bin_dir.mkdir(exist_ok=True)
    for name in ("srun", "scontrol", "torchrun"):
        script = bin_dir / name
        script.write_text(textwrap.dedent(f"""\
            #!/bin/bash
            echo "{name} $*" >> {record}
            if [[ "{name}" == srun ]]; then while [[ "$1" == -* ]]; do shift; done; exec "$@"; fi
            if [[ "{name}" == scontrol && "$1" == show && "$2" == hostnames ]]; then echo node1; fi
            if [[ "{name}" == scontrol && "$1" == show && "$2" == node ]]; then echo "NodeAddr=127.0.0.1"; fi
            exit 0
            """))
        script.chmod(0o755)


def _check_scripts(report: Report, label: str, plan: Path, work: Path, canary: Path) -> None:
    for name in ("job.sbatch", "launch.sh"):
        f = plan / name
        if f.is_file() and subprocess.run(["bash", "-n", str(f)], capture_output=True).returncode != 0:
            report.add("unparseable", f"{label}: {name}")
    if (plan / "job.sbatch").is_file():
        bin_dir = work / "fakebin"
        _fakes(bin_dir, work / "record.txt")
        env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_SUBMIT_DIR=str(plan),
                   SLURM_JOB_NODELIST="node[1-2]", SLURM_NNODES="1", SLURM_NODEID="0", SLURM_JOB_ID="1")
        try:
            subprocess.run(["bash", str(plan / "job.sbatch")], cwd=work, env=env, capture_output=True, timeout=60)
        except subprocess.TimeoutExpired:
            report.add("hang", f"{label}: job.sbatch with fakes ran over 60 s")


def _mutate_yaml(rng: random.Random, text: str, canary: Path) -> str:
    import yaml

    lines = text.splitlines()
    op = rng.choice(["value", "value", "value", "delete", "duplicate", "insert", "alias", "indent"])
    if op == "delete" and lines:
        del lines[rng.randrange(len(lines))]
        return "\n".join(lines) + "\n"
    if op == "duplicate" and lines:
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
        return "\n".join(lines) + "\n"
    if op == "indent" and lines:
        i = rng.randrange(len(lines))
        lines[i] = " " * rng.choice([1, 3, 7]) + lines[i]
        return "\n".join(lines) + "\n"
    if op == "alias":
        return text + "bomb: &a [1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
            f"b{i}: &a{i} [*{'a' if i == 0 else f'a{i - 1}'}, *{'a' if i == 0 else f'a{i - 1}'}]\n" for i in range(30))
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if not isinstance(doc, dict):
        return text
    if op == "insert":
        doc[rng.choice(["extra", "trainng", "model2"])] = rng.choice(hostile_values(canary))
        return yaml.safe_dump(doc, allow_unicode=True)
    # Replace one leaf (anywhere in the document) with a hostile value.
    paths = []

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, (*path, k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, (*path, i))
        paths.append(path)

    walk(doc, ())
    path = rng.choice([p for p in paths if p] or [()])
    if not path:
        return text
    target = doc
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = rng.choice(hostile_values(canary))
    try:
        return yaml.safe_dump(doc, allow_unicode=True, width=10**6)
    except (ValueError, yaml.YAMLError):
        return text


def case_spec(rng, work, report, canary, timeout):
    src = rng.choice(sorted((ROOT / "examples").glob("*.yaml")))
    spec = work / "spec.yaml"
    spec.write_text(_mutate_yaml(rng, src.read_text(), canary), encoding="utf-8")
    cluster = "local" if src.stem == "tiny" else rng.choice(["dgx16", "local", "dgx-a100-80gb-hdr"])
    out = work / "out" / "plan"
    label = f"spec {src.name}"
    ok = _check_run(report, label, _invoke(["plan", str(spec), "--cluster", cluster, "--out", str(out)], work,
                                           timeout))
    _after_plan(report, label, ok, out, work, canary)


def case_profile(rng, work, report, canary, timeout):
    src = rng.choice(sorted((ROOT / "cluster_profiles").glob("*.yaml")))
    profiles = work / "profiles"
    profiles.mkdir()
    name = rng.choice(["mine", src.stem, "x y", "a.b", f"n{rng.randrange(100)}"])
    (profiles / f"{name}.yaml").write_text(_mutate_yaml(rng, src.read_text(), canary), encoding="utf-8")
    out = work / "out" / "plan"
    spec = ROOT / "examples" / ("tiny.yaml" if src.stem == "local" else "llama3-8b.yaml")
    label = f"profile {src.name} as {name!r}"
    args = ["plan", str(spec), "--cluster", name, "--profiles-dir", str(profiles), "--out", str(out)]
    if src.stem != "local":
        args += ["--nodes", "1"]
    ok = _check_run(report, label, _invoke(args, work, timeout))
    _after_plan(report, label, ok, out, work, canary)


FLAG_VALUES = ["0", "-1", "1", "2", "3", "8", "1000000000000000000", "nan", "inf", "1.5", "x", "", "$(touch CANARY)"]


def case_flags(rng, work, report, canary, timeout):
    args = ["plan", str(ROOT / "examples" / rng.choice(["tiny.yaml", "llama3-8b.yaml", "gpt3-175b.yaml"])),
            "--cluster", rng.choice(["local", "dgx16", "nope"])]
    for flag in rng.sample(["--tp", "--pp", "--dp", "--vpp", "--zero", "--mbs", "--nodes", "--gpus-per-node",
                            "--memory-margin", "--top", "--recompute", "--runtime"], rng.randrange(0, 5)):
        args += [flag, rng.choice(FLAG_VALUES + ["none", "full", "megatron", "deepspeed"])]
    if rng.random() < 0.3:
        args.append(rng.choice(["--sp", "--no-sp", "--json", "--explain", "--no-write", "--check"]))
    odd = ["out/plan", "out dir/$(touch CANARY)", "out/`touch CANARY`", "out/a\nb", "/".join(["d"] * 300),
           "x" * 300, "out/../out2", "existing-file"]
    outname = rng.choice(odd)
    (work / "existing-file").write_text("x")
    out = work / outname.replace("CANARY", str(canary))
    if "--no-write" not in args:
        args += ["--out", str(out)]
    label = f"flags {args[1:]}"[:300]
    existed = {p for p in work.rglob("*")}
    ok = _check_run(report, label, _invoke(args, work, timeout))
    if not ok:
        new = {p for p in work.rglob("*")} - existed
        if new:
            report.add("leftover", f"{label}: {sorted(str(p.relative_to(work)) for p in new)[:3]}")
        return
    try:
        written = out.is_dir()
    except OSError:  # a name the filesystem cannot hold was refused, as it should be
        written = False
    if written:
        _check_scripts(report, label, out, work, canary)


def _after_plan(report, label, ok, out, work, canary):
    if not ok:
        leftovers = [p for p in (work / "out").rglob("*")] if (work / "out").exists() else []
        if leftovers or (work / "out").exists():
            report.add("leftover", f"{label}: {[str(p.relative_to(work)) for p in leftovers][:3] or ['out/']}")
        return
    _check_scripts(report, label, out, work, canary)


def _good_plan(work: Path) -> Path:
    from click.testing import CliRunner

    from orchestrator.cli.main import main

    out = work / "plan"
    r = CliRunner().invoke(main, ["plan", str(ROOT / "examples" / "tiny.yaml"), "--cluster", "local", "--out",
                                  str(out)])
    assert r.exit_code == 0, r.output
    return out


def case_plandir(rng, work, report, canary, timeout):
    plan = _good_plan(work)
    name = rng.choice(["plan.yaml", "ds_config.json", "megatron_args.txt", "launch.sh", "job.sbatch"])
    f = plan / name
    data = f.read_bytes()
    op = rng.choice(["truncate", "garbage", "flip", "delete", "dir", "nul", "deep-json", "yaml-value", "huge"])
    if op == "truncate":
        f.write_bytes(data[: rng.randrange(len(data) + 1)])
    elif op == "garbage":
        f.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 500))))
    elif op == "flip":
        i = rng.randrange(len(data))
        f.write_bytes(data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1:])
    elif op == "delete":
        f.unlink()
    elif op == "dir":
        f.unlink()
        f.mkdir()
    elif op == "nul":
        f.write_bytes(data + b"\x00")
    elif op == "deep-json":
        f.write_text("[" * 100_000 + "]" * 100_000)
    elif op == "huge":
        f.write_bytes(data + b"#" * (17 << 20))
    else:
        f.write_text(_mutate_yaml(rng, data.decode("utf-8", "replace"), canary), encoding="utf-8")
    label = f"plandir {name} {op}"
    for args in (["validate", str(plan)], ["submit", str(plan), "--dry-run"], ["calibrate", str(plan), "--cluster",
                                                                                 "local"]):
        _check_run(report, f"{label}: {args[0]}", _invoke(args, work, timeout))


def case_registry(rng, work, report, canary, timeout):
    from orchestrator.run.registry import Registry, now_utc

    reg = Registry(work)
    for i in range(3):
        with reg.reserve(f"plans/p{i}", False) as (insert, _):
            insert(job_id=rng.choice([str(100 + i), "abc", "", "-5"]), executor=rng.choice(["slurm", "local"]),
                   cluster="c", plan_dir=f"plans/p{i}", plan_sha256="x", submitted_at=now_utc(),
                   state=rng.choice(["COMPLETED", "FAILED", "RUNNING"]), run_dir=str(work / "runs" / str(i)),
                   log_dir=str(work / "logs"))
    con = sqlite3.connect(reg.path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    data = reg.path.read_bytes()
    op = rng.choice(["truncate", "garbage", "flip", "drop", "dsorch-file", "none"])
    if op == "truncate":
        reg.path.write_bytes(data[: rng.randrange(len(data))])
    elif op == "garbage":
        reg.path.write_bytes(os.urandom(rng.randrange(1, 4096)))
    elif op == "flip":
        i = rng.randrange(len(data))
        reg.path.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:])
    elif op == "drop":
        con = sqlite3.connect(reg.path)
        con.execute("DROP TABLE jobs")
        con.close()
    elif op == "dsorch-file":
        shutil.rmtree(work / ".dsorch")
        (work / ".dsorch").write_text("x")
    for args in (["status"], ["status", "--json"], ["logs", "100"], ["cancel", "101"], ["status", "--repair"]):
        _check_run(report, f"registry {op}: {' '.join(args)}", _invoke(args, work, timeout))


CASES = {"spec": case_spec, "profile": case_profile, "flags": case_flags, "plandir": case_plandir,
         "registry": case_registry}


def run(n: int, seed: int = 0, kinds=KINDS, timeout: float = 30.0, progress: bool = False) -> Report:
    report = Report()
    root_canaries = {p for p in Path("/").glob(f"{CANARY}*")}
    for i in range(n):
        rng = random.Random(f"{seed}-{i}")
        kind = kinds[i % len(kinds)]
        with tempfile.TemporaryDirectory(prefix="dsorch-fuzz-") as tmp:
            work = Path(tmp)
            canary = work / f"{CANARY}-{i}"
            before = set(Path.cwd().glob("*"))
            try:
                CASES[kind](rng, work, report, canary, timeout)
            except Exception as e:  # noqa: BLE001 - a bug in the harness is reported, not hidden
                report.add("harness", f"{kind} #{i}: {type(e).__name__}: {e}"[:300])
            # The canary is one exact path (hostile values say `touch <it>`); directories whose
            # names merely quote that command are data, not an injection.
            found = [canary] if canary.exists() else []
            found += [p for p in Path("/").glob(f"{CANARY}*") if p not in root_canaries]
            if found:
                report.add("injection", f"{kind} #{i}: {[str(p) for p in found]}")
            stray = set(Path.cwd().glob("*")) - before
            if stray:
                report.add("leftover", f"{kind} #{i}: files in the working directory {sorted(map(str, stray))[:3]}")
        report.cases += 1
        if progress and (i + 1) % 100 == 0:
            print(f"  {i + 1} cases, {sum(map(len, report.problems.values()))} problems", flush=True)
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000, help="number of cases")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated subset of {','.join(KINDS)}")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds one case may take before it is a hang")
    a = ap.parse_args(argv)
    kinds = tuple(k for k in a.kinds.split(",") if k)
    t0 = time.monotonic()
    report = run(a.n, a.seed, kinds, a.timeout, progress=True)
    print(f"{report.cases} cases in {time.monotonic() - t0:.0f} s ({', '.join(kinds)}), seed {a.seed}")
    for cls in ("traceback", "hang", "blow-up", "unparseable", "injection", "leftover", "harness"):
        found = report.problems.get(cls, [])
        print(f"  {cls:12s} {len(found)}")
        for detail in found[:5]:
            print(f"      {detail}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
