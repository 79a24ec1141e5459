"""Every shipped example, planned for both runtimes, survives Megatron-LM's own checks.

test_megatron_args.py checks megatron_args.txt against our idea of Megatron's flags; this runs Megatron's real
code on it (scripts/check_megatron_lm.py: parse_args, validate_args, the tokenizer, TransformerConfig, the
train-iters and dataset-config checks of pretrain()). It needs a Megatron-LM checkout in $MEGATRON_LM and an
interpreter that imports it in $MEGATRON_LM_PYTHON (default: this one); see the script's docstring for the
packages. Without $MEGATRON_LM it is skipped.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from orchestrator.cli.main import main
from orchestrator.render.megatron import render_megatron_args

from ..conftest import ROOT, spec_paths
from ..unit.test_megatron_moe import CASES as MOE_PLANS
from ..unit.test_megatron_moe import case_plan as moe_case_plan

MEGATRON_LM = os.environ.get("MEGATRON_LM")
MEGATRON_LM_PYTHON = os.environ.get("MEGATRON_LM_PYTHON") or sys.executable
CHECK = ROOT / "scripts" / "check_megatron_lm.py"

pytestmark = pytest.mark.skipif(
    not MEGATRON_LM,
    reason="MEGATRON_LM is not set: point it at a Megatron-LM checkout (and MEGATRON_LM_PYTHON at a Python "
           "that imports it) to run Megatron's own argument checks on the planned megatron_args.txt")

def _runtimes(spec) -> tuple[str, ...]:
    # An FP8 spec plans for the megatron runtime only (the deepspeed runtime refuses it: test_cli).
    return ("megatron",) if "\n  fp8:" in spec.read_text() else ("deepspeed", "megatron")


CASES = [(s, rt) for s in spec_paths() for rt in _runtimes(s)]


def plan(runner, *args):
    return runner.invoke(main, ["plan", *map(str, args)], catch_exceptions=False)


@pytest.mark.parametrize("spec, runtime", CASES, ids=[f"{s.stem}-{rt}" for s, rt in CASES])
def test_planned_megatron_args_pass_megatron_lm_checks(runner, in_tmp, spec, runtime):
    # tiny is a laptop model: plan it on the local profile like the quickstart does.
    cluster = "local" if spec.stem == "tiny" else "dgx16"
    out = in_tmp / "plan"
    args = [f"examples/{spec.name}", "--cluster", cluster, "--runtime", runtime, "--out", out]
    r = plan(runner, *args)
    if r.exit_code == 2 and "does not fit" in r.output:
        # Too big for the cluster at its default size: take the node count the error suggests
        # (test_cli checks that suggestion); with none, there is nothing to check.
        m = re.search(r"rerun with --nodes (\d+)", r.output)
        if m is None:
            pytest.skip(f"{spec.stem} does not fit {cluster} at any node count")
        r = plan(runner, *args, "--nodes", m.group(1))
    assert r.exit_code == 0, r.output

    proc = subprocess.run(
        [MEGATRON_LM_PYTHON, str(CHECK), "--megatron-lm", MEGATRON_LM, "--verbose", str(out)],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (
        f"Megatron-LM rejects the plan's megatron_args.txt:\n{proc.stdout}{proc.stderr[-3000:]}\n"
        f"--- megatron_args.txt ---\n{(out / 'megatron_args.txt').read_text()}")
    assert proc.stdout.startswith("PASS"), proc.stdout


@pytest.mark.parametrize("extra", [[], ["--recompute", "none", "--zero", "2"]], ids=["distributed-optimizer",
                                                                                   "megatron-fsdp"])
def test_llama3_405b_uneven_interleaved_layout_passes_megatron_lm(runner, in_tmp, extra):
    """TP8 PP16 with the embedding and the loss counted in the split and two virtual stages per rank,
    also as Meta trained it (no recomputation, gradients sharded: Megatron-FSDP optim_grads, with
    CUDA_DEVICE_MAX_CONNECTIONS unset as launch.sh leaves it): Megatron-LM's own validate_args and
    TransformerConfig accept exactly what dsorch emits."""
    out = in_tmp / "plan"
    r = plan(runner, "examples/llama3-405b.yaml", "--cluster", "dgx16", "--nodes", "2048", "--runtime", "megatron",
             "--tp", "8", "--pp", "16", "--vpp", "2", "--cp", "1", *extra, "--out", out)
    assert r.exit_code == 0, r.output
    proc = subprocess.run(
        [MEGATRON_LM_PYTHON, str(CHECK), "--megatron-lm", MEGATRON_LM, "--verbose", str(out)],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and proc.stdout.startswith("PASS"), (
        f"{proc.stdout}{proc.stderr[-3000:]}\n{(out / 'megatron_args.txt').read_text()}")


MOE_CASES = [(name, rt) for name in sorted(MOE_PLANS) for rt in ("megatron", "deepspeed")]


@pytest.mark.parametrize("name, runtime", MOE_CASES, ids=[f"{n}-{rt}" for n, rt in MOE_CASES])
def test_moe_mla_and_gpt_oss_flags_pass_megatron_lm(tmp_path, name, runtime):
    """The mixture-of-experts, multi-latent-attention and GPT-OSS flags of hand-set layouts (DeepSeek-V3 with
    expert parallelism 32 under an interleaved pipeline, Mixtral with EP 8 and the all-to-all overlap, GPT-OSS
    at EP 64, Qwen3 with TP 2 and sequence parallelism, a Qwen1.5-MoE with shared experts and a capacity):
    Megatron-LM's parse_args, validate_args and TransformerConfig accept exactly what dsorch renders. The
    plan directory is the two files the check reads (megatron_args.txt; plan.yaml's runtime, GPU and layout)."""
    plan = moe_case_plan(name, runtime)
    L = plan.layout
    (tmp_path / "megatron_args.txt").write_text(render_megatron_args(plan))
    (tmp_path / "plan.yaml").write_text(
        f"runtime: {runtime}\ncluster:\n  gpu: {plan.profile.gpu.name}\n"
        f"layout:\n  tp: {L.tp}\n  pp: {L.pp}\n  dp: {L.dp}\n  cp: {L.cp}\n")
    proc = subprocess.run(
        [MEGATRON_LM_PYTHON, str(CHECK), "--megatron-lm", MEGATRON_LM, "--verbose", str(tmp_path)],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and proc.stdout.startswith("PASS"), (
        f"{proc.stdout}{proc.stderr[-3000:]}\n{(tmp_path / 'megatron_args.txt').read_text()}")
