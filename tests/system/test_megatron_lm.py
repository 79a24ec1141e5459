"""Every shipped example, planned for both runtimes, survives Megatron-LM's own checks.

test_megatron_args.py checks megatron_args.txt against our idea of Megatron's flags; this runs Megatron's real
code on it (scripts/check_megatron_lm.py: parse_args, validate_args, the tokenizer, TransformerConfig, the
train-iters and dataset-config checks of pretrain()). It needs a Megatron-LM checkout in $MEGATRON_LM and an
interpreter that imports it in $MEGATRON_LM_PYTHON (default: this one); see the script's docstring for the
packages. Without $MEGATRON_LM it is skipped.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.cli.main import main
from orchestrator.plan.decisions import decide
from orchestrator.plan.layout import Layout
from orchestrator.render.megatron import render_megatron_args
from orchestrator.spec.cluster import load_profile

from ..conftest import ROOT, spec_paths
from ..unit.test_megatron_moe import CASES as MOE_PLANS
from ..unit.test_megatron_moe import DEEPSEEK_V3, GPT_OSS_120B, QWEN3_30B_A3B, QWEN15_MOE
from ..unit.test_megatron_moe import case_plan as moe_case_plan
from ..unit.test_megatron_moe import case_spec as moe_case_spec

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


@pytest.mark.parametrize("extra", [[], ["--recompute", "none", "--zero", "2"], ["--recompute", "full", "--recompute-layers", "3"]],
                         ids=["distributed-optimizer", "megatron-fsdp", "partial-recompute"])
def test_llama3_405b_uneven_interleaved_layout_passes_megatron_lm(runner, in_tmp, extra):
    """TP8 PP16 with the embedding and the loss counted in the split and two virtual stages per rank,
    also as Meta trained it (no recomputation, gradients sharded: Megatron-FSDP optim_grads, with
    CUDA_DEVICE_MAX_CONNECTIONS unset as launch.sh leaves it), and with 3 of each virtual stage's layers
    recomputed (--recompute-method block): Megatron-LM's own validate_args and TransformerConfig accept
    exactly what dsorch emits."""
    out = in_tmp / "plan"
    r = plan(runner, "examples/llama3-405b.yaml", "--cluster", "dgx16", "--nodes", "2048", "--runtime", "megatron",
             "--tp", "8", "--pp", "16", "--vpp", "2", "--cp", "1", *extra, "--out", out)
    assert r.exit_code == 0, r.output
    proc = subprocess.run(
        [MEGATRON_LM_PYTHON, str(CHECK), "--megatron-lm", MEGATRON_LM, "--verbose", str(out)],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and proc.stdout.startswith("PASS"), (
        f"{proc.stdout}{proc.stderr[-3000:]}\n{(out / 'megatron_args.txt').read_text()}")


@pytest.mark.parametrize("cp_comm, recipe", [("a2a+p2p", "tensorwise"), ("all_gather", "blockwise")])
def test_cp_fp8_and_overlap_flags_pass_megatron_lm(runner, in_tmp, cp_comm, recipe):
    """Llama 3 70B in FP8 with context parallelism exchanged by Transformer Engine's hierarchical a2a+p2p
    (or all_gather), TP communication overlapped, gradients reduced in bf16 and FP8 weights only: Megatron-LM's
    own validate_args and TransformerConfig accept --cp-comm-type, --hierarchical-context-parallel-sizes,
    --fp8-recipe, --tp-comm-overlap, --grad-reduce-in-bf16 and --fp8-param-gather as dsorch emits them."""
    import yaml

    doc = yaml.safe_load((ROOT / "examples" / "llama3-70b.yaml").read_text())
    doc["training"].update(fp8="hybrid", fp8_recipe=recipe, cp_comm_type=cp_comm, grad_reduce_in_fp32=False,
                           tp_comm_overlap=True, fp8_param_gather=True)
    spec, out = in_tmp / "spec.yaml", in_tmp / "plan"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = plan(runner, spec, "--cluster", "dgx16", "--nodes", "16", "--runtime", "megatron", "--tp", "4", "--pp", "4",
             "--cp", "4", "--sp", "--out", out)
    assert r.exit_code == 0, r.output
    flags = (out / "megatron_args.txt").read_text()
    assert f"--cp-comm-type {cp_comm}" in flags and f"--fp8-recipe {recipe}" in flags, flags
    assert "--fp8-param-gather" in flags, flags
    proc = subprocess.run(
        [MEGATRON_LM_PYTHON, str(CHECK), "--megatron-lm", MEGATRON_LM, "--verbose", str(out)],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and proc.stdout.startswith("PASS"), f"{proc.stdout}{proc.stderr[-3000:]}\n{flags}"


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


COUNT = ROOT / "scripts" / "megatron_param_count.py"
# Small models with every architecture feature the flags express, each next to the real model it shrinks.
TINY = {
    # DeepSeek-V3: MLA with a query low rank, sigmoid grouped top-k router with expert bias, a shared expert,
    # dense leading layers, one MTP module.
    "deepseek-v3": DEEPSEEK_V3 | {
        "num_layers": 5, "hidden_size": 64, "ffn_hidden_size": 96, "num_attention_heads": 4, "vocab_size": 128,
        "max_position_embeddings": 256,
        "mla": {"q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8},
        "moe": DEEPSEEK_V3["moe"] | {"num_experts": 8, "top_k": 4, "ffn_hidden_size": 16, "groups": 4,
                                     "group_top_k": 2, "dense_leading_layers": 2}},
    # GPT-OSS: biases everywhere, sinks, alternating sliding windows, clamped quick-GeGLU, its own head width.
    "gpt-oss": GPT_OSS_120B | {
        "num_layers": 4, "hidden_size": 64, "ffn_hidden_size": 32, "num_attention_heads": 4, "num_kv_heads": 2,
        "kv_channels": 24, "vocab_size": 128, "max_position_embeddings": 256, "sliding_window": 16,
        "moe": GPT_OSS_120B["moe"] | {"num_experts": 4, "top_k": 2, "ffn_hidden_size": 32}},
    # Qwen3-MoE: QK-norm and a head width of its own; here every other layer dense (--moe-layer-freq 2).
    "qwen3-moe": QWEN3_30B_A3B | {
        "num_layers": 3, "hidden_size": 64, "ffn_hidden_size": 96, "num_attention_heads": 4, "num_kv_heads": 2,
        "kv_channels": 32, "vocab_size": 128, "max_position_embeddings": 256,
        "moe": QWEN3_30B_A3B["moe"] | {"num_experts": 8, "top_k": 2, "ffn_hidden_size": 16, "layer_freq": 2}},
    # Qwen1.5-MoE: gated shared experts, QKV biases, a dense leading layer then every other layer MoE.
    "qwen1.5-moe": QWEN15_MOE | {
        "num_layers": 4, "hidden_size": 64, "ffn_hidden_size": 96, "num_attention_heads": 4, "vocab_size": 128,
        "max_position_embeddings": 256,
        "moe": QWEN15_MOE["moe"] | {"num_experts": 6, "top_k": 2, "ffn_hidden_size": 16, "shared_experts": 2,
                                    "shared_ffn_hidden_size": 40, "dense_leading_layers": 1, "layer_freq": 2}},
}


@pytest.mark.parametrize("name", sorted(TINY))
def test_the_flags_build_the_model_dsorch_counts(tmp_path, name):
    """Megatron-LM builds, from the rendered flags, a model with exactly the parameters dsorch counts: the main
    model (ModelSpec.num_params) and the MTP modules (mtp_params), the routers' expert bias included (a buffer in
    Megatron, a parameter in the count). scripts/megatron_param_count.py says what it changes to build on CPU."""
    spec = moe_case_spec(TINY[name], {"seq_length": 64, "global_batch_size": 8})
    layout = Layout(tp=1, pp=1, dp=1, vpp=1, zero_stage=1, micro_batch_size=1, grad_accum_steps=8,
                    recompute="none", sequence_parallel=False)
    # checkpoint: a stand-in for Plan.checkpoint (its --save-interval), which this count does not read.
    profile = load_profile("dgx16").profile
    plan = SimpleNamespace(spec=spec, layout=layout, runtime="megatron", profile=profile,
                           checkpoint=SimpleNamespace(steps=1000), decisions=decide(spec, profile, "megatron", layout))
    (tmp_path / "megatron_args.txt").write_text(render_megatron_args(plan))
    proc = subprocess.run([MEGATRON_LM_PYTHON, str(COUNT), "--megatron-lm", MEGATRON_LM, "megatron_args.txt"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    built = json.loads(proc.stdout.strip().splitlines()[-1])
    m = spec.model
    mtp_bias = m.mtp_layers * (m.moe.num_experts if m.moe.expert_bias else 0)
    assert built["mtp_params"] + mtp_bias == m.mtp_params
    assert built["params"] - built["mtp_params"] + built["expert_bias"] - mtp_bias == m.num_params


def test_override_flags_meet_megatron_lms_own_parser(runner, in_tmp):
    """The spec's override flags (orchestrator.spec.overrides) reach Megatron-LM's parse_args as dsorch
    merged them: a flag dsorch emits given again is replaced (--eval-iters), a new one appended; a flag
    dsorch's argument table does not know passes `dsorch plan` unchecked, and the real parser is what
    refuses it when it is not Megatron-LM's."""
    import yaml

    def planned(extra: list[str]) -> Path:
        doc = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
        doc["overrides"] = {"megatron_args": ["--log-interval 5", "--eval-iters 7", *extra]}
        spec = in_tmp / f"tiny{len(extra)}.yaml"
        spec.write_text(yaml.safe_dump(doc, sort_keys=False))
        out = in_tmp / f"plan{len(extra)}"
        r = plan(runner, spec, "--cluster", "local", "--runtime", "megatron", "--out", out)
        assert r.exit_code == 0, r.output
        return out

    def check(out: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [MEGATRON_LM_PYTHON, str(CHECK), "--megatron-lm", MEGATRON_LM, "--verbose", str(out)],
            capture_output=True,
            text=True,
            timeout=900,
        )

    proc = check(planned([]))
    assert proc.returncode == 0 and proc.stdout.startswith("PASS"), f"{proc.stdout}{proc.stderr[-3000:]}"
    proc = check(planned(["--no-such-megatron-flag-for-dsorch 1"]))
    assert proc.returncode == 1 and "--no-such-megatron-flag-for-dsorch" in proc.stdout + proc.stderr, proc.stdout


def test_what_dsorch_submit_adds_to_launch_sh_passes_megatron_lm(runner, in_tmp, monkeypatch):
    """`dsorch submit` runs launch.sh with flags after megatron_args.txt's (run/megatron_job.py): the run
    directory's checkpoints as --save/--load, --train-iters for --steps with --lr-decay-iters keeping the plan's
    schedule, --save-interval and --log-interval 1. Megatron-LM's own parse_args and validate_args accept them,
    and the last value of each flag is the one it uses."""
    from orchestrator.run.submission import prepare_submission

    out = in_tmp / "plan"
    r = plan(runner, "examples/tiny.yaml", "--cluster", "local", "--runtime", "megatron", "--out", out)
    assert r.exit_code == 0, r.output
    monkeypatch.setenv("MEGATRON_LM", MEGATRON_LM)
    sub = prepare_submission(out, None, None, 10, None, in_tmp / "run", None, in_tmp, save_interval=5)
    extra = sub.job.megatron_args()
    proc = subprocess.run(
        [MEGATRON_LM_PYTHON, str(CHECK), "--megatron-lm", MEGATRON_LM, "--verbose", "--extra-args", " ".join(extra),
         str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and proc.stdout.startswith("PASS"), f"{proc.stdout}{proc.stderr[-3000:]}\n{extra}"
    facts = dict(re.findall(r"^    args\.(\w+) = (.*)$", proc.stdout, re.M))
    assert facts == {"save": str(in_tmp / "run" / "checkpoints"), "load": str(in_tmp / "run" / "checkpoints"),
                     "train_iters": "10", "lr_decay_iters": "30", "save_interval": "5", "log_interval": "1"}, facts
