"""`dsorch diff` (orchestrator/plandir/diff.py): what changed between two plan directories, in the
user's terms: layout, pins, predictions, flags and keys, the profile's and the spec's fields."""

from __future__ import annotations

import json

from ..conftest import PROFILES
from .test_report import _doc, run


def test_diff_says_what_changed_in_the_users_terms(runner, in_tmp):
    a, b = in_tmp / "a", in_tmp / "b"
    assert run(runner, "plan", "examples/llama3-70b.yaml", "--cluster", "dgx16", "--runtime", "megatron",
               "--out", a).exit_code == 0
    assert run(runner, "plan", "examples/llama3-70b.yaml", "--cluster", "dgx16", "--runtime", "megatron",
               "--tp", "8", "--out", b).exit_code == 0
    da, db = _doc(a), _doc(b)
    r = run(runner, "diff", a, b)
    assert r.exit_code == 0, r.output
    assert f"  tp: {da['layout']['tp']} -> 8" in r.output
    assert "  pinned: nothing -> tp=8" in r.output
    sa, sb = da["predicted"]["step_time_s"], db["predicted"]["step_time_s"]
    assert f"  step_time_s: {sa:g} -> {sb:g} ({100 * (sb / sa - 1):+.1f} %)" in r.output
    assert f"  --tensor-model-parallel-size: {da['layout']['tp']} -> 8" in r.output
    j = json.loads(run(runner, "diff", a, b, "--json").output)
    assert {"flag": "--tensor-model-parallel-size", "before": str(da["layout"]["tp"]), "after": "8"} in j["megatron_flags"]
    assert run(runner, "diff", a, a).output.endswith("no differences.\n")
    # A deepspeed plan against a megatron one: ds_config.json keys appear as added.
    c = in_tmp / "c"
    assert run(runner, "plan", "examples/llama3-70b.yaml", "--cluster", "dgx16", "--out", c).exit_code == 0
    out = run(runner, "diff", a, c).output
    assert "  runtime: megatron -> deepspeed" in out and "  train_batch_size: (absent) -> 512" in out


def test_diff_names_the_profile_and_spec_fields_that_changed(runner, in_tmp):
    # A user profile and a copy of the spec, each changed between plan a and plan b.
    prof = in_tmp / "prof"
    prof.mkdir()
    # As a SLURM cluster's profile, which may grow: the local executor runs one node only.
    shipped = (PROFILES / "local.yaml").read_text().replace("executor: local", "executor: slurm")
    (prof / "local.yaml").write_text(shipped)
    spec = in_tmp / "tiny.yaml"
    spec.write_text((in_tmp / "examples" / "tiny.yaml").read_text())
    args = ["plan", spec, "--cluster", "local", "--profiles-dir", prof]
    assert run(runner, *args, "--out", in_tmp / "a").exit_code == 0
    (prof / "local.yaml").write_text(shipped.replace("memory_gib: 4", "memory_gib: 6"))
    spec.write_text(spec.read_text().replace("global_batch_size: 16", "global_batch_size: 32"))
    assert run(runner, *args, "--out", in_tmp / "b").exit_code == 0
    r = run(runner, "diff", in_tmp / "a", in_tmp / "b")
    assert r.exit_code == 0, r.output
    assert "cluster profile fields:\n  gpu.memory_gib: 4 -> 6\n" in r.output
    assert "model spec fields:\n  training.global_batch_size: 16 -> 32\n" in r.output
    j = json.loads(run(runner, "diff", in_tmp / "a", in_tmp / "b", "--json").output)
    assert j["cluster_profile"] == [{"name": "gpu.memory_gib", "before": 4, "after": 6}]
    assert j["model_spec"] == [{"name": "training.global_batch_size", "before": 16, "after": 32}]
    # Nothing changed in either: no such sections.
    assert "fields" not in run(runner, "diff", in_tmp / "a", in_tmp / "a").output
