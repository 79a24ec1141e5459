"""`dsorch doctor` on this machine (the local executor, 4 gloo ranks): reachability, the sweep,
and the arithmetic that turns it into profile figures. The 2-node run is in test_slurm.py."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from orchestrator.cli.main import main
from orchestrator.run.collectives import bus_factor, sizes
from orchestrator.run.doctor import measured_profile_doc
from orchestrator.spec.cluster import load_profile


def test_bus_factors_are_nccl_tests():
    # doc/PERFORMANCE.md of nccl-tests: all-reduce 2(n-1)/n, all-gather (n-1)/n.
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("all_gather", 8) == pytest.approx(0.875)
    assert bus_factor("all_reduce", 1) == 0.0
    assert sizes(1 << 20) == [4096, 16384, 65536, 262144, 1 << 20]


def test_measured_figures_go_into_the_profiles_units():
    prof = load_profile("dgx16").profile  # 8 GPUs and 8 NICs of 400 Gb/s per node
    doc = {"results": [
        {"group": "intra-node", "ranks": 8, "op": "all_reduce", "bytes": 4096, "time_us": 70.0, "busbw_gbs": 0.1},
        {"group": "intra-node", "ranks": 8, "op": "all_reduce", "bytes": 1 << 28, "time_us": 9e5, "busbw_gbs": 360.0},
        {"group": "inter-node", "ranks": 2, "op": "all_reduce", "bytes": 4096, "time_us": 40.0, "busbw_gbs": 0.2},
        {"group": "inter-node", "ranks": 2, "op": "all_gather", "bytes": 1 << 28, "time_us": 9e5, "busbw_gbs": 45.0},
    ]}
    out = measured_profile_doc(prof, doc, "dgx16-doctor")
    # NVLink: the profile states both directions, the bus bandwidth is one.
    assert out["intra_node"] == {"bandwidth_gbps": 720.0, "latency_us": 5.0}  # 70 us over 2 x 7 hops
    # Inter-node: 45 GB/s per GPU x 8 GPUs / 8 NICs x 8 bit = 360 Gb/s per NIC.
    assert out["inter_node"] == {"bandwidth_gbps": 360.0, "latency_us": 20.0}
    assert out["extends"] == "dgx16"


def test_doctor_runs_on_this_machine(in_tmp):
    r = CliRunner().invoke(main, ["doctor", "--cluster", "local", "--max-size", "1", "--iters", "2"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "4 ranks on 1 node(s)" in r.output and "every rank reached every other" in r.output
    assert "inter-node: not measured (needs 2 nodes)" in r.output
    result = json.loads(next((in_tmp / ".dsorch" / "doctor").glob("local-*/doctor.json")).read_text())
    assert result["allreduce_ok"] and result["unreachable"] == [] and result["world_size"] == 4
    assert {(x["group"], x["op"]) for x in result["results"]} == {
        ("world", "all_reduce"), ("world", "all_gather"), ("intra-node", "all_reduce"), ("intra-node", "all_gather")}
    assert all(x["time_us"] > 0 and x["busbw_gbs"] > 0 for x in result["results"])


def test_shell_completion_completes_commands_choices_and_clusters(in_tmp):
    import os
    import subprocess
    import sys
    from pathlib import Path

    dsorch = str(Path(sys.executable).with_name("dsorch"))
    script = subprocess.run([dsorch, "completion", "bash"], capture_output=True, text=True, check=True).stdout
    assert "_DSORCH_COMPLETE=bash_complete" in script and "complete -o nosort -F _dsorch_completion dsorch" in script

    def complete(words: str) -> list[str]:
        env = dict(os.environ, COMP_WORDS=words, COMP_CWORD=str(len(words.split()) - (0 if words.endswith(" ") else 1)),
                   _DSORCH_COMPLETE="bash_complete")
        out = subprocess.run([dsorch], env=env, capture_output=True, text=True, cwd=in_tmp).stdout
        return [line.split(",", 1)[1] for line in out.splitlines()]

    assert complete("dsorch pl") == ["plan", "plot"]
    assert complete("dsorch plan x --runtime ") == ["deepspeed", "megatron"]
    assert complete("dsorch doctor --cluster dgx") == ["dgx-a100-80gb-hdr", "dgx-b200", "dgx16"]
