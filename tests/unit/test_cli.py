"""`dsorch` as a user runs it: every shipped pair plans and validates, outputs are deterministic,
bad input gets one paragraph and exit code 2, --check catches drift."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml

from orchestrator.cli.main import main
from orchestrator.costmodel.stacks import MEMORY_KEYS, TIME_PARTS
from orchestrator.validate.plan_dir import validate_path

from ..conftest import ROOT, profile_names, spec_paths

GOLDEN = Path(__file__).parents[1] / "golden"
UPDATE_GOLDEN = os.environ.get("DSORCH_UPDATE_GOLDEN") == "1"


def plan(runner, *args):
    return runner.invoke(main, ["plan", *map(str, args)], catch_exceptions=False)


PAIRS = [(s, p, rt) for s in spec_paths() for p in profile_names() for rt in ("deepspeed", "megatron")]


@pytest.mark.parametrize("spec, profile, runtime", PAIRS, ids=[f"{s.stem}-{p}-{rt}" for s, p, rt in PAIRS])
def test_every_shipped_pair_plans_and_validates(runner, in_tmp, spec, profile, runtime):
    out = in_tmp / "plan"
    r = plan(runner, f"examples/{spec.name}", "--cluster", profile, "--runtime", runtime, "--out", out)
    if r.exit_code == 2 and "training.fp8" in r.output:
        # FP8 needs the megatron runtime and a GPU with FP8 tensor cores: refused, with the fix, nothing written.
        assert "use --runtime megatron" in r.output or "states no FP8 peak" in r.output, r.output
        assert not out.exists()
        return
    if r.exit_code == 2 and "does not fit" in r.output:
        # Too big for this cluster: the error must quantify the gap, and its suggestion must work.
        assert re.search(r"needs [\d.]+ GiB \([\d.]+ GiB more\)", r.output), r.output
        assert not out.exists(), "nothing may be written when planning fails"
        m = re.search(r"rerun with --nodes (\d+)", r.output)
        if m is None:
            assert "No node count up to 64x" in r.output or "runs on this machine, one node" in r.output, r.output
            return
        r = plan(runner, f"examples/{spec.name}", "--cluster", profile, "--runtime", runtime, "--out", out,
                 "--nodes", m.group(1))
    assert r.exit_code == 0, r.output
    expected = {"job.sbatch", "launch.sh", "megatron_args.txt", "plan.md", "plan.yaml"} | (
        {"ds_config.json"} if runtime == "deepspeed" else set())
    assert {p.name for p in out.iterdir()} == expected
    assert validate_path(out) == []
    doc = yaml.safe_load((out / "plan.yaml").read_text())
    assert doc["runtime"] == runtime
    assert doc["memory_gib_per_gpu"]["total"] <= doc["cluster"]["gpu_memory_gib"]
    L = doc["layout"]
    assert L["tp"] * L["cp"] * L["pp"] * L["dp"] == doc["cluster"]["world_size"]
    for text in (out / n for n in expected):
        assert str(in_tmp) not in text.read_text(), f"{text.name} contains an absolute path"


def test_outputs_are_byte_identical_across_runs_and_working_directories(runner, in_tmp, monkeypatch):
    out = in_tmp / "plans" / "a"
    assert plan(runner, "examples/llama3-70b.yaml", "--cluster", "dgx16", "--out", "plans/a").exit_code == 0
    first = {f.name: f.read_bytes() for f in out.iterdir()}
    assert os.access(out / "launch.sh", os.X_OK)
    # The same inputs named from elsewhere (another cwd, absolute paths): byte-identical, and
    # --check agrees.
    (in_tmp / "deep" / "er").mkdir(parents=True)
    monkeypatch.chdir(in_tmp / "deep" / "er")
    args = [str(in_tmp / "examples" / "llama3-70b.yaml"), "--cluster", "dgx16", "--out", "../../plans/a"]
    assert plan(runner, *args, "--check").exit_code == 0
    assert plan(runner, *args).exit_code == 0
    assert {f.name: f.read_bytes() for f in out.iterdir()} == first
    doc = yaml.safe_load(first["plan.yaml"])
    assert doc["inputs"]["model_spec"]["path"] == "../../examples/llama3-70b.yaml"


# Golden files: regenerate with DSORCH_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_cli.py -k golden
GOLDEN_CASES = {
    "llama3-70b-dgx16": ["examples/llama3-70b.yaml", "--cluster", "dgx16"],
    "llama3-405b-dgx16-n32-megatron": ["examples/llama3-405b.yaml", "--cluster", "dgx16", "--nodes", "32",
                                       "--runtime", "megatron"],
    "gpt3-175b-a100-pinned": ["examples/gpt3-175b.yaml", "--cluster", "dgx-a100-80gb-hdr", "--nodes", "48",
                              "--tp", "8", "--pp", "8", "--zero", "1", "--recompute", "selective"],
    "tiny-local": ["examples/tiny.yaml", "--cluster", "local"],
}


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_golden_files(runner, in_tmp, case):
    out = in_tmp / "out"
    r = plan(runner, *GOLDEN_CASES[case], "--out", out)
    assert r.exit_code == 0, r.output
    golden = GOLDEN / case
    if UPDATE_GOLDEN:
        shutil.rmtree(golden, ignore_errors=True)
        shutil.copytree(out, golden)
    assert golden.is_dir(), f"no golden files for {case}; create them with DSORCH_UPDATE_GOLDEN=1"
    assert sorted(p.name for p in golden.iterdir()) == sorted(p.name for p in out.iterdir())
    for f in sorted(golden.iterdir()):
        new = (out / f.name).read_text()
        assert new == f.read_text(), (
            f"{case}/{f.name} changed. If intended, regenerate: "
            f"DSORCH_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_cli.py -k golden")


def test_check_passes_on_fresh_plan_and_fails_with_a_diff(runner, in_tmp):
    out = in_tmp / "p"
    args = ["examples/tiny.yaml", "--cluster", "local", "--out", out]
    assert plan(runner, *args).exit_code == 0
    r = plan(runner, *args, "--check")
    assert r.exit_code == 0 and "up to date" in r.output
    cfg = json.loads((out / "ds_config.json").read_text())
    cfg["gradient_clipping"] = 0.5
    (out / "ds_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    r = plan(runner, *args, "--check")
    assert r.exit_code == 1
    assert '-  "gradient_clipping": 0.5,' in r.output and '+  "gradient_clipping": 1.0,' in r.output
    assert "differs from what dsorch" in r.stderr
    # --check never writes
    assert json.loads((out / "ds_config.json").read_text())["gradient_clipping"] == 0.5


def test_json_output_shape(runner, in_tmp):
    r = plan(runner, "examples/llama3-8b.yaml", "--cluster", "dgx16", "--json")
    assert r.exit_code == 0
    doc = json.loads(r.output)
    assert set(doc["layout"]) == {"tp", "pp", "dp", "vpp", "zero_stage", "micro_batch_size", "grad_accum_steps",
                                  "recompute", "sequence_parallel", "cp", "ep", "etp", "recompute_layers"}
    assert tuple(doc["memory_gib_per_gpu"]) == MEMORY_KEYS and tuple(doc["time_breakdown_s"]) == TIME_PARTS
    assert {"step_time_s", "tokens_per_s", "mfu"} <= set(doc["predicted"])
    assert doc["layout"]["recompute"] in ("none", "selective", "full")
    assert len(doc["alternatives"]) >= 3
    for alt in doc["alternatives"]:
        assert {"layout", "memory_gib_per_gpu", "predicted"} <= set(alt)
        assert alt["predicted"]["step_time_s"] >= doc["predicted"]["step_time_s"]


def test_table_marks_the_chosen_layout(runner, in_tmp):
    r = plan(runner, "examples/llama3-70b.yaml", "--cluster", "dgx16")
    assert r.exit_code == 0
    assert "searched" in r.output and "legal layouts" in r.output
    rows = [ln for ln in r.output.splitlines() if ln.startswith("*")]
    assert rows and "* chosen:" in r.output
    assert "70.55B parameters" in r.output


def test_everything_pinned_evaluates_exactly_that_layout(runner, in_tmp):
    pins = ["--tp", "8", "--pp", "2", "--dp", "8", "--zero", "1", "--mbs", "1", "--recompute", "full", "--vpp",
            "1", "--sp"]
    r = plan(runner, "examples/llama3-70b.yaml", "--cluster", "dgx16", *pins, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["search"]["evaluated"] == 1
    assert doc["layout"] == {"tp": 8, "pp": 2, "dp": 8, "vpp": 1, "zero_stage": 1, "micro_batch_size": 1,
                             "grad_accum_steps": 64, "recompute": "full", "sequence_parallel": True, "cp": 1,
                             "ep": 1, "etp": 1, "recompute_layers": 0}


def test_pinned_layout_that_does_not_fit_says_by_how_much(runner, in_tmp):
    pins = ["--tp", "1", "--pp", "1", "--dp", "128", "--zero", "1", "--mbs", "1", "--recompute", "none", "--vpp",
            "1", "--no-sp"]
    r = plan(runner, "examples/llama3-70b.yaml", "--cluster", "dgx16", *pins, "--out", in_tmp / "p")
    assert r.exit_code == 2
    assert re.search(r"tp1 pp1 dp128 zero1 mbs1 gas4 rc=none, needs [\d.]+ GiB \([\d.]+ GiB more\)", r.output)
    assert "Traceback" not in r.output and not (in_tmp / "p").exists()


def test_bf16_zero0_with_accumulation_is_refused_with_the_reason(runner, in_tmp):
    """DeepSpeed refuses fp32 gradient accumulation at ZeRO-0 with bf16, and bf16 accumulation
    loses gradient: with bf16 and several micro-batches per step, ZeRO-0 is not a legal layout."""
    pins = ["--tp", "8", "--pp", "4", "--zero", "0", "--mbs", "1", "--recompute", "full", "--no-sp"]
    r = plan(runner, "examples/llama3-70b.yaml", "--cluster", "dgx16", *pins, "--no-write")
    assert r.exit_code == 2
    assert "DeepSpeed accumulates gradients in fp32 only from ZeRO-1 on" in " ".join(r.output.split())
    # With one micro-batch per step nothing accumulates: ZeRO-0 stays legal; fp32 and Megatron are unaffected.
    from orchestrator.runtimes import DEEPSPEED, MEGATRON

    assert DEEPSPEED.zero_stages(1, "bf16", 1) == [0, 1, 2, 3] and DEEPSPEED.zero_stages(1, "bf16", 2) == [1, 2, 3]
    assert DEEPSPEED.zero_stages(2, "bf16", 8) == [1] and DEEPSPEED.zero_stages(2, "fp32", 8) == [0, 1]
    assert MEGATRON.zero_stages(4, "bf16", 64) == [0, 1]


def test_nothing_fits_suggests_node_count(runner, in_tmp):
    r = plan(runner, "examples/llama3-405b.yaml", "--cluster", "dgx16", "--nodes", "2")
    assert r.exit_code == 2
    m = re.search(r"It needs at least (\d+) nodes of dgx16 \(rerun with --nodes (\d+)\)", r.output)
    assert m and m.group(1) == m.group(2)
    assert plan(runner, "examples/llama3-405b.yaml", "--cluster", "dgx16", "--nodes", m.group(1)).exit_code == 0
    assert plan(runner, "examples/llama3-405b.yaml", "--cluster", "dgx16", "--nodes",
                int(m.group(1)) - 1).exit_code == 2


@pytest.mark.parametrize("args, message", [
    (["--tp", "3"], "tp*cp*pp = 3*1*1 = 3 does not divide the cluster's 4 GPUs (1 x 4)"),
    (["--pp", "2", "--zero", "3"], "zero_stage=3 cannot be combined with pp=2 in DeepSpeed's pipeline engine "
                                   "(it refuses ZeRO-2/3 with pipeline parallelism); use pp=1 or zero_stage<=1"),
    (["--tp", "1", "--sp"], "sequence parallelism splits the tensor-parallel region's activations and needs tp > 1"),
    (["--vpp", "2", "--pp", "2"], "vpp=2: DeepSpeed's pipeline engine runs plain 1F1B with no interleaved schedule"),
    (["--gpus-per-node", "8"], "--gpus-per-node 8: profile 'local' has 4 GPUs per node"),
    (["--memory-margin", "4"], "--memory-margin 4 GiB leaves nothing of the 4 GiB per GPU"),
    (["--tp", "4"], "tp=4 does not divide num_kv_heads=2"),
    (["--runtime", "megatron", "--zero", "3"], "optim_grads_params (ZeRO-3) is not modelled"),
])
def test_illegal_pins_name_the_rule(runner, in_tmp, args, message):
    r = plan(runner, "examples/tiny.yaml", "--cluster", "local", *args, "--out", in_tmp / "p")
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split())
    assert "Traceback" not in r.output and not (in_tmp / "p").exists()


def test_more_stages_than_layers_names_the_rule(runner, in_tmp):
    # 8 GPUs of the local profile's hardware: a SLURM cluster's profile (the local executor runs one node).
    (in_tmp / "profiles").mkdir()
    (in_tmp / "profiles" / "cpus.yaml").write_text("extends: local\nexecutor: slurm\n")
    r = plan(runner, "examples/tiny.yaml", "--cluster", "cpus", "--profiles-dir", in_tmp / "profiles", "--nodes", "2",
             "--pp", "8", "--out", in_tmp / "p")
    assert r.exit_code == 2, r.output
    assert "pp=8 cannot split num_layers=4 into stages" in " ".join(r.output.split())
    assert "Traceback" not in r.output and not (in_tmp / "p").exists()


@pytest.mark.parametrize("content, message", [
    ("name: x\nmodel: [1, 2\n", "m.yaml:3: malformed YAML"),
    ("name: x\nsource: y\nmodel: {num_layers: 2}\ntraining: {seq_length: 8, global_batch_size: 2}\nextra: 1\n",
     "m.yaml:5: unknown key 'extra' in the model spec; valid keys here: name, source, model, training"),
    ("- 1\n- 2\n", "expected a YAML mapping"),
])
def test_bad_spec_files(runner, in_tmp, content, message):
    (in_tmp / "m.yaml").write_text(content)
    r = plan(runner, "m.yaml", "--cluster", "local", "--out", in_tmp / "p")
    assert r.exit_code == 2
    assert message in r.output and "Traceback" not in r.output
    assert not (in_tmp / "p").exists()


def test_unknown_cluster(runner, in_tmp):
    r = plan(runner, "examples/tiny.yaml", "--cluster", "dgx61")
    assert r.exit_code == 2
    assert "unknown cluster profile 'dgx61'. Did you mean 'dgx16'?" in r.output


def test_several_nodes_of_the_local_executor_are_refused_at_plan_time(runner, in_tmp):
    r = plan(runner, "examples/tiny.yaml", "--cluster", "local", "--nodes", "2", "--out", in_tmp / "p")
    assert r.exit_code == 2, r.output
    assert "--nodes 2: profile 'local' runs on this machine (executor: local), which is one node" in r.output
    assert not (in_tmp / "p").exists()


def test_a_signal_delay_of_over_half_the_time_limit_is_warned_of_at_plan_time(runner, in_tmp):
    """job.sbatch checkpoints and requeues at SLURM's warning: a warning 90 s before a 2-minute
    limit leaves each allocation 30 s of training."""
    (in_tmp / "profiles").mkdir()
    for name, time_limit in (("short", "00:02:00"), ("enough", "00:03:00")):
        (in_tmp / "profiles" / f"{name}.yaml").write_text(f"extends: dgx16\nslurm: {{time: '{time_limit}'}}\n")
    r = plan(runner, "examples/llama3-8b.yaml", "--cluster", "short", "--profiles-dir", "profiles", "--out", "p")
    assert r.exit_code == 0, r.output
    warning = "slurm.signal_delay_s 90 s leaves 30 s of the 00:02:00 time limit for training (less than half"
    assert warning in " ".join(r.output.split())
    assert yaml.safe_load((in_tmp / "p" / "plan.yaml").read_text())["explain"]["notes"]["signal_delay"].startswith(
        "slurm.signal_delay_s 90 s leaves 30 s"
    )
    r = plan(runner, "examples/llama3-8b.yaml", "--cluster", "enough", "--profiles-dir", "profiles", "--out", "q")
    assert r.exit_code == 0 and "signal_delay_s" not in r.output, r.output


def test_unwritable_out(runner, in_tmp):
    blocker = in_tmp / "file"
    blocker.write_text("x")
    r = plan(runner, "examples/tiny.yaml", "--cluster", "local", "--out", blocker / "plan")
    assert r.exit_code == 2
    assert f"--out {blocker / 'plan'}: cannot write the plan directory" in r.output
    r = plan(runner, "examples/tiny.yaml", "--cluster", "local", "--out", blocker)
    assert r.exit_code == 2 and "exists and is not a directory" in r.output


def test_rewrite_keeps_other_files_and_removes_stale_generated_ones(runner, in_tmp):
    out = in_tmp / "p"
    assert plan(runner, "examples/tiny.yaml", "--cluster", "local", "--out", out).exit_code == 0
    (out / "runs").mkdir()
    assert plan(runner, "examples/tiny.yaml", "--cluster", "local", "--runtime", "megatron", "--out", out).exit_code == 0
    assert (out / "runs").is_dir() and not (out / "ds_config.json").exists()
    assert not [p for p in out.iterdir() if p.name.startswith(".")], "temporary files left behind"


def test_profiles_list_json_and_user_profile(runner, in_tmp):
    user = in_tmp / "profiles"
    user.mkdir()
    (user / "dgx16.yaml").write_text("extends: dgx16\nnodes: 4\n")
    (user / "mycluster.yaml").write_text("extends: hgx-h200-ndr\nnodes: 2\n")
    r = runner.invoke(main, ["profiles", "--json", "--profiles-dir", str(user)])
    assert r.exit_code == 0
    rows = {row["name"]: row for row in json.loads(r.output)}
    assert {"dgx16", "dgx-a100-80gb-hdr", "hgx-h200-ndr", "local", "mycluster"} <= set(rows)
    assert rows["dgx16"]["origin"] == "user" and rows["dgx16"]["nodes"] == 4
    assert rows["local"]["origin"] == "shipped"
    assert rows["mycluster"]["gpu"] == "H200-SXM-141GB" and rows["mycluster"]["gpu_memory_gib"] == 140.4
    for row in rows.values():
        assert {"name", "origin", "nodes", "gpus_per_node", "gpu", "gpu_memory_gib"} <= set(row)
    r = runner.invoke(main, ["profiles", "dgx16"], env={"DSORCH_PROFILES_DIR": str(user)})
    assert r.exit_code == 0 and "nodes: 4" in r.output and "origin: user" in r.output


def test_validate_command(runner, in_tmp):
    out = in_tmp / "p"
    assert plan(runner, "examples/tiny.yaml", "--cluster", "local", "--out", out).exit_code == 0
    r = runner.invoke(main, ["validate", str(out)])
    assert r.exit_code == 0 and "valid" in r.output
    cfg = json.loads((out / "ds_config.json").read_text())
    dp = yaml.safe_load((out / "plan.yaml").read_text())["layout"]["dp"]
    r = runner.invoke(main, ["validate", str(out / "ds_config.json"), "--dp", str(dp)])
    assert r.exit_code == 0, r.output
    cfg["train_batch_size"] = cfg["train_batch_size"] * 2
    cfg["zero_optimisation"] = {"stage": 1}
    cfg["gradient_clipping"] = "1.0"
    (out / "ds_config.json").write_text(json.dumps(cfg))
    r = runner.invoke(main, ["validate", str(out)])
    assert r.exit_code == 2
    text = " ".join(r.output.split())
    assert "DeepSpeed's DeepSpeedConfig rejects it at data-parallel size" in text
    assert "unknown top-level key 'zero_optimisation'" in text and "did you mean 'zero_optimization'?" in text
    assert "'gradient_clipping' is the string '1.0'" in text
    r = runner.invoke(main, ["validate", str(out / "ds_config.json")])
    assert r.exit_code == 2 and "pass --dp N" in r.output


def test_validate_catches_bad_megatron_flags(runner, in_tmp):
    out = in_tmp / "p"
    assert plan(runner, "examples/tiny.yaml", "--cluster", "local", "--out", out).exit_code == 0
    with open(out / "megatron_args.txt", "a") as fh:
        fh.write("--tensor-model-paralel-size 2\n")
    r = runner.invoke(main, ["validate", str(out)])
    assert r.exit_code == 2
    assert "--tensor-model-paralel-size" in r.output


def test_version_and_help(runner):
    from orchestrator import __version__

    r = runner.invoke(main, ["--version"])
    assert r.output.strip() == f"dsorch {__version__}"
    r = runner.invoke(main, ["plan", "--help"])
    assert r.exit_code == 0
    for opt in ("--cluster", "--out", "--check", "--json", "--runtime", "--nodes", "--tp", "--pp", "--dp", "--zero",
                "--mbs", "--recompute", "--vpp", "--sp / --no-sp", "--profiles-dir"):
        assert opt in r.output
    assert "Typical use" in runner.invoke(main, ["--help"]).output


def _surface(cmd, prefix=""):
    import click

    rows = []
    for p in cmd.params:
        if isinstance(p, click.Option):
            kind = p.type.name if not p.is_flag else "flag"
            rows.append(f"{prefix}{cmd.name} {'/'.join(p.opts + p.secondary_opts)} {kind}")
        else:
            rows.append(f"{prefix}{cmd.name} <{p.name}>")
    if isinstance(cmd, click.Group):
        for name in sorted(cmd.commands):
            rows += _surface(cmd.commands[name], prefix=f"{prefix}{cmd.name} ")
    return rows


def test_cli_surface_snapshot():
    """A change to what users type must be deliberate: update tests/cli_surface.txt with it."""
    snapshot = Path(__file__).parents[1] / "cli_surface.txt"
    current = "\n".join(_surface(main)) + "\n"
    if UPDATE_GOLDEN:
        snapshot.write_text(current)
    assert current == snapshot.read_text(), "CLI surface changed; regenerate with DSORCH_UPDATE_GOLDEN=1"


def test_schema_keys_snapshot():
    from orchestrator.spec.cluster import ClusterProfile
    from orchestrator.spec.model import SpecFile

    def keys(model, prefix=""):
        out = []
        for name, field in model.model_fields.items():
            out.append(prefix + name)
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                out += keys(ann, prefix + name + ".")
        return out

    snapshot = Path(__file__).parents[1] / "schema_keys.txt"
    current = "\n".join(["# model spec", *keys(SpecFile), "# cluster profile", *keys(ClusterProfile)]) + "\n"
    if UPDATE_GOLDEN:
        snapshot.write_text(current)
    assert current == snapshot.read_text(), "YAML schema changed; regenerate with DSORCH_UPDATE_GOLDEN=1"


def test_installed_package_ships_templates_and_profiles():
    """pyproject maps templates/ and cluster_profiles/ into the package for non-editable installs."""
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert cfg["package-dir"]["orchestrator._templates"] == "templates"
    assert cfg["package-dir"]["orchestrator._profiles"] == "cluster_profiles"
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert all(list((ROOT / "templates").glob(pat)) for pat in data["orchestrator._templates"])


def test_explain_shows_stacks_rejections_and_the_close_call_verdict(runner, in_tmp):
    r = plan(runner, "examples/llama3-70b.yaml", "--cluster", "dgx16", "--explain")
    assert r.exit_code == 0, r.output
    for text in ("Memory per GPU (GiB", "Time per step (s; exposed communication only)", "Rejected by memory:",
                 "GiB over)", "on its 5 published runs", "Chosen layout's step time: "):
        assert text in r.output
    assert any(verdict in r.output for verdict in ("more than the model's max error", "within the model's",
                                                   "where the model's error is unknown"))
    out = in_tmp / "p"
    assert plan(runner, "examples/llama3-70b.yaml", "--cluster", "dgx16", "--out", out).exit_code == 0
    doc = yaml.safe_load((out / "plan.yaml").read_text())
    assert {"layouts", "rejected_by_memory", "top_two"} <= set(doc["explain"])


def test_every_prediction_says_how_sure_it_is(runner, in_tmp):
    """Issue 11: an interval from the residuals of the engine and GPU it was fitted on, in the
    table, --json and plan.yaml; a layout outside any fitted domain says so."""
    from orchestrator.costmodel.calibration import resolve_efficiency
    from orchestrator.spec.cluster import load_profile

    r = plan(runner, "examples/llama3-70b.yaml", "--cluster", "dgx16", "--json", "--top", "40")
    doc = json.loads(r.output)
    z3 = resolve_efficiency(load_profile("dgx16").profile, "deepspeed-zero3")
    by_kind = {}
    for entry in [doc, *doc["alternatives"]]:
        L = entry["layout"]
        by_kind.setdefault((L["zero_stage"], L["tp"] == 1), entry["predicted"])
    # ZeRO-3 without TP is what the FSDP runs measured: their largest residual is the interval.
    assert by_kind[3, True]["step_time_interval"] == pytest.approx(z3.interval, abs=1e-4)
    assert "deepspeed-zero3/h100-sxm5-ndr, n=5" in by_kind[3, True]["confidence"]
    # ZeRO-3 with TP goes beyond them; ZeRO-1 has no runs of its own: both say so and give none.
    assert by_kind[3, False]["step_time_interval"] is None
    assert "outside the fitted domain of deepspeed-zero3/h100-sxm5-ndr: tp " in by_kind[3, False]["confidence"]
    assert by_kind[1, False]["step_time_interval"] is None
    assert "outside the fitted domain" in by_kind[1, False]["confidence"]
    table = plan(runner, "examples/llama3-70b.yaml", "--cluster", "dgx16", "--no-write").output
    assert f"±{100 * z3.interval:.0f}%" in table and " ? " in table and "outside the fitted domain" in table
    meg = json.loads(plan(runner, "examples/llama3-70b.yaml", "--cluster", "dgx16", "--runtime", "megatron",
                          "--json").output)
    assert "megatron/h100-sxm5-ndr, n=12" in meg["predicted"]["confidence"]  # 9 dense and 3 MoE runs


def test_calibrate_command_end_to_end(runner, in_tmp):
    # Measurements of two layouts, 30% slower than the shipped local profile predicts: the fit must
    # move the efficiencies and write a profile that extends `local` and plans.
    out = in_tmp / "p"
    assert plan(runner, "examples/tiny.yaml", "--cluster", "local", "--out", out, "--json").exit_code == 0
    records = []
    for args in (["--tp", "1", "--pp", "1", "--mbs", "4", "--zero", "1"], ["--tp", "2", "--pp", "2", "--mbs", "2"]):
        doc = json.loads(plan(runner, "examples/tiny.yaml", "--cluster", "local", "--json", *args).output)
        records.append({"layout": doc["layout"], "model": "examples/tiny.yaml",
                        "step_time_s": doc["predicted"]["step_time_s"] * 1.3})
    (in_tmp / "measured.yaml").write_text(yaml.safe_dump({"records": records}))
    r = runner.invoke(main, ["calibrate", "measured.yaml", "--cluster", "local", "--name", "local-fit", "--out",
                             "profiles/local-fit.yaml"])
    assert r.exit_code == 0, r.output
    text = (in_tmp / "profiles" / "local-fit.yaml").read_text()
    assert "extends: local" in text and "name: local-fit" in text
    assert "after" in r.output
    r = plan(runner, "examples/tiny.yaml", "--cluster", "local-fit", "--profiles-dir", "profiles", "--json", "--tp",
             "1", "--pp", "1", "--mbs", "4", "--zero", "1")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["predicted"]["step_time_s"] == pytest.approx(records[0]["step_time_s"], rel=0.1)


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r.update(runtme="megatron"), "runtme: Extra inputs are not permitted"),
    (lambda r: r.update(peak_mem_gb=61.2), "peak_mem_gb: Extra inputs are not permitted"),
    (lambda r: r["layout"].update(zero=1), "layout.zero: Extra inputs are not permitted"),
    (lambda r: r.update(runtime="megatorn"), "runtime: Input should be 'deepspeed' or 'megatron'"),
    (lambda r: r.update(step_time_s=-1), "step_time_s: Input should be greater than 0"),
])
def test_calibration_records_are_typed(runner, in_tmp, mutate, message):
    """A misspelt key in a records file is an error naming it, not a value silently ignored."""
    rec = {"model": "examples/tiny.yaml", "step_time_s": 0.1,
           "layout": {"tp": 1, "pp": 1, "dp": 4, "zero_stage": 1, "micro_batch_size": 4}}
    mutate(rec)
    (in_tmp / "measured.yaml").write_text(yaml.safe_dump({"records": [rec]}))
    r = runner.invoke(main, ["calibrate", "measured.yaml", "--cluster", "local"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "measured.yaml: record 0: " + message in " ".join(r.output.split()), r.output


def test_a_directory_in_the_way_leaves_the_old_plan_untouched(runner, in_tmp):
    out = in_tmp / "p"
    assert plan(runner, "examples/tiny.yaml", "--cluster", "local", "--out", out).exit_code == 0
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    (out / "plan.yaml").unlink()
    (out / "plan.yaml").mkdir()
    r = plan(runner, "examples/tiny.yaml", "--cluster", "local", "--runtime", "megatron", "--out", out)
    assert r.exit_code == 2 and "is a directory where dsorch writes a file" in r.output
    after = {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()}
    assert after == {k: v for k, v in before.items() if k != "plan.yaml"}
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_output_into_a_closed_pipe_ends_quietly(tmp_path):
    """`dsorch logs JOB | head` closes the pipe before the log is out: the command stops without an
    error message, as other command-line tools do, rather than reporting "Broken pipe" as a path
    problem."""
    import subprocess
    import sys

    from orchestrator.run.registry import Registry
    from orchestrator.run.backends import backend_for

    out, _ = backend_for("local").log_paths(tmp_path / "jobs", "4242", 0)
    out.parent.mkdir(parents=True)
    out.write_text("a line of a long training log\n" * 10_000)  # far past a pipe's buffer
    with Registry(tmp_path).reserve("plan", force=False) as (insert, _update):
        insert(job_id="4242", executor="local", cluster="local", plan_dir="plan", plan_sha256="0", state="COMPLETED",
               submitted_at="2026-01-01T00:00:00+00:00", run_dir=str(tmp_path / "run"), log_dir=str(out.parent),
               requeues=0)
    read_end, write_end = os.pipe()
    os.close(read_end)  # no reader left: writes fail with EPIPE, as after `head` has exited
    try:
        r = subprocess.run(
            [sys.executable, "-c", "from orchestrator.cli.main import main; main()", "logs", "4242"],
            stdout=write_end, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
            env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120,
        )
    finally:
        os.close(write_end)
    assert r.stderr == "", r.stderr
    assert r.returncode != 0  # not all of the output arrived (click exits 1, as `cat` exits non-zero)
