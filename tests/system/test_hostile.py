"""Hostile values in profiles, specs and paths never run anything in job.sbatch or launch.sh.

The scripts are executed for real by bash; only `srun`, `scontrol` and `torchrun` are replaced
by recording fakes (named fake_*), since those start distributed jobs that need a cluster.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from orchestrator.cli.main import main

@pytest.fixture
def fakes(tmp_path):
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    record = tmp_path / "record.txt"
    for name in ("srun", "scontrol", "torchrun"):
        script = bin_dir / name
        script.write_text(textwrap.dedent(f"""\
            #!/bin/bash
            # fake_{name}: records its arguments and environment instead of starting a job
            {{ echo "{name} $*"; echo "EVIL=$EVIL"; }} >> {record}
            if [[ "{name}" == srun ]]; then while [[ "$1" == -* ]]; do shift; done; exec "$@"; fi
            if [[ "{name}" == scontrol && "$1" == show && "$2" == hostnames ]]; then echo node1; fi
            if [[ "{name}" == scontrol && "$1" == show && "$2" == node ]]; then echo "NodeName=node1 NodeAddr=10.9.8.7 x"; fi
            """))
        script.chmod(0o755)
    return bin_dir, record


def test_hostile_profile_and_spec_values_stay_data(runner, tmp_path, fakes, monkeypatch):
    bin_dir, record = fakes
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "evil.yaml").write_text(textwrap.dedent("""\
        extends: local
        slurm:
          partition: "debug; touch CANARY4"
          account: "$(touch CANARY5)"
          qos: "a b 'c'"
          constraint: "`touch CANARY6`"
          extra: {comment: "x; touch CANARY7"}
          env:
            EVIL: "$(touch CANARY1); `touch CANARY2`; echo 'it''s' \\"q\\" && touch CANARY3"
        """))
    spec = tmp_path / "spec.yaml"
    spec.write_text((Path(__file__).resolve().parents[2] / "examples" / "tiny.yaml").read_text()
                    .replace("name: tiny", "name: \"tiny $(touch CANARY8); rm -rf x\""))
    workdir = tmp_path / "dir with spaces $(touch CANARY9)"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    out = workdir / "plan `touch CANARY10`"
    r = runner.invoke(main, ["plan", str(spec), "--cluster", "evil", "--profiles-dir", str(profiles), "--out", str(out)])
    assert r.exit_code == 0, r.output

    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_SUBMIT_DIR=str(out),
               SLURM_JOB_NODELIST="node[1-2]", SLURM_NNODES="1", SLURM_NODEID="0")
    env.pop("EVIL", None)
    for script in ("job.sbatch",):
        res = subprocess.run(["bash", str(out / script)], cwd=workdir, env=env, capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 0, res.stderr
    leftovers = sorted(p.name for p in tmp_path.rglob("CANARY*")) + sorted(p.name for p in Path.cwd().glob("CANARY*"))
    assert leftovers == [], f"a hostile value was executed: {leftovers}"
    text = record.read_text()
    # The env value reached torchrun's environment byte for byte, and the master address came
    # from SLURM's NodeAddr.
    assert "EVIL=$(touch CANARY1); `touch CANARY2`; echo 'it''s' \"q\" && touch CANARY3" in text
    assert "--master-addr 10.9.8.7" in text
    sbatch = (out / "job.sbatch").read_text()
    assert "#SBATCH --job-name=dsorch-tiny-touch-CANARY8-rm--rf-x\n" in sbatch
    assert "#SBATCH --partition='debug; touch CANARY4'" in sbatch


@pytest.mark.parametrize("yaml_text, message", [
    ("extends: local\nslurm: {partition: \"a\\nb\"}\n", "slurm.partition contains a line break"),
    ("extends: local\nslurm: {env: {\"BAD-NAME\": x}}\n", "is not a valid environment variable name"),
    ("extends: local\nslurm: {setup: [\"module load x\\nrm -rf /\"]}\n", "slurm.setup[0] contains a line break"),
])
def test_line_breaks_and_bad_env_names_are_refused(runner, tmp_path, yaml_text, message):
    (tmp_path / "bad.yaml").write_text(yaml_text)
    r = runner.invoke(main, ["plan", str(Path(__file__).resolve().parents[2] / "examples" / "tiny.yaml"),
                             "--cluster", "bad", "--profiles-dir", str(tmp_path)])
    assert r.exit_code == 2 and message in r.output, r.output


def test_spec_name_with_line_break_is_refused(runner, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text((Path(__file__).resolve().parents[2] / "examples" / "tiny.yaml").read_text()
                    .replace("name: tiny", "name: \"tiny\\nrm -rf /\""))
    r = runner.invoke(main, ["plan", str(spec), "--cluster", "local"])
    assert r.exit_code == 2 and "key 'name'" in r.output
