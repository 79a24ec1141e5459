"""The bundled entrypoint trains for real: DeepSpeed on CPU over gloo, up to 4 processes.

Every run uses a plan directory written by `dsorch plan examples/tiny.yaml --cluster local`
(pinned layouts via --tp/--pp/--dp/--zero/--gpus-per-node); there are no hand-written configs.

Tolerance of the equivalence tests: relative 1e-5 on each loss. All runs are fp32 on the same
data and the same full weights (initialised unsharded, then sliced), so they compute the same
function; what differs is the order of floating-point sums -- a row-parallel GEMM adds two
half-length dot products, gloo all-reduces and DeepSpeed's data-parallel averaging add in
another order, micro-batches accumulate differently. Each such reordering moves a result by a
few ulp (fp32 epsilon 1.2e-7) and Adam carries it forward; over the steps compared the measured
gap is below 5e-7 relative. 1e-5 leaves a 20x margin, while every real bug seen while building
this (activations of different sequence shards mixed by a partitioned pipe send, a gradient
not reduced over the tp group) moved losses by 1e-4 to 1e-3 already at step 1 or 2.

Cost on 2 cores: about 3 minutes. Nothing is JIT-compiled: CPU runs use torch's AdamW and skip
DeepSpeed's inference-only shared-memory op (orchestrator/train/loop/launch.py says why).
"""

from __future__ import annotations

import json
import math
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from .harness import clean_env

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny.yaml"
CORPUS = ROOT / "examples" / "data" / "pydoc"
STEPS = 6
RTOL = 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plan(out: Path, *pins: str) -> Path:
    """`dsorch plan examples/tiny.yaml --cluster local --out OUT PINS...`, in-process."""
    from click.testing import CliRunner

    from orchestrator.cli.main import main

    r = CliRunner().invoke(main, ["plan", str(TINY), "--cluster", "local", "--out", str(out), *pins],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return out


def train(plan_dir: Path, nproc: int, run_dir: Path, *args: str, expect_ok: bool = True):
    """torchrun --standalone (it picks a free rendezvous port) -m orchestrator.train ..."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(nproc), "-m", "orchestrator.train", "--plan", str(plan_dir), "--run-dir",
           str(run_dir), "--steps", str(STEPS), *args]
    p = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=300)
    if expect_ok:
        assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    return p


def metrics(run_dir: Path) -> dict[int, dict]:
    """step -> record; a step logged twice (re-run after a resume) keeps the last record.
    Evaluations' records ("kind": "eval") are left out."""
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in recs if "kind" not in r}


def checkpoints(run_dir: Path) -> list[str]:
    return sorted(c.name for c in (run_dir / "checkpoints").glob("step*"))


def losses(run_dir: Path) -> list[float]:
    m = metrics(run_dir)
    return [m[s]["loss"] for s in sorted(m)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[float]:
    """The single-process run every layout is compared with."""
    d = tmp_path_factory.mktemp("single")
    train(plan(d / "plan", "--gpus-per-node", "1"), 1, d / "run", "--no-save")
    ref = losses(d / "run")
    assert len(ref) == STEPS
    # Untrained model on 256 byte ids: loss near ln(256) = 5.545.
    assert abs(ref[0] - math.log(256)) < 0.05
    return ref


# name -> (processes, dsorch plan pins, expected layout in plan.yaml)
LAYOUTS = {
    "tp2-pp2-sp": (4, ["--tp", "2", "--pp", "2", "--dp", "1"], dict(tp=2, pp=2, dp=1)),
    "pp2-dp2-zero1": (4, ["--tp", "1", "--pp", "2", "--dp", "2", "--zero", "1"],
                      dict(tp=1, pp=2, dp=2, zero_stage=1)),
    "tp2-dp2": (4, ["--tp", "2", "--pp", "1", "--dp", "2"], dict(tp=2, pp=1, dp=2)),
    "dp2-zero1": (2, ["--gpus-per-node", "2", "--dp", "2", "--zero", "1"], dict(dp=2, zero_stage=1)),
    "dp2-zero2": (2, ["--gpus-per-node", "2", "--dp", "2", "--zero", "2"], dict(dp=2, zero_stage=2)),
    "dp2-zero3": (2, ["--gpus-per-node", "2", "--dp", "2", "--zero", "3"], dict(dp=2, zero_stage=3)),
}


@pytest.fixture(scope="module")
def layout_runs(tmp_path_factory):
    """Runs of the pinned layouts, made once and shared (the resume test reuses tp2-pp2)."""
    cache = {}

    def get(name):
        if name not in cache:
            import yaml

            nproc, pins, expected = LAYOUTS[name]
            d = tmp_path_factory.mktemp(name)
            plan_dir = plan(d / "plan", *pins)
            layout = yaml.safe_load((plan_dir / "plan.yaml").read_text())["layout"]
            assert {k: layout[k] for k in expected} == expected
            train(plan_dir, nproc, d / "run", "--no-save")
            cache[name] = (plan_dir, losses(d / "run"), d / "run")
        return cache[name]

    return get


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_single_process(name, reference, layout_runs):
    _, got, run_dir = layout_runs(name)
    assert got == pytest.approx(reference, rel=RTOL), f"{name}: {got} vs single {reference}"
    rec = metrics(run_dir)[STEPS]
    assert set(rec) >= {"step", "loss", "tokens_per_s", "tflops_per_gpu", "mfu", "peak_mem_gib"}
    assert rec["tokens_per_s"] > 0 and 0 < rec["mfu"]


def test_resume_after_kill_continues_exactly(tmp_path, layout_runs):
    """SIGKILL rank 0 after step 4 (checkpoints every 2 steps): the resumed run's losses are
    those of the uninterrupted run, exactly (same layout, same deterministic CPU kernels). A
    damaged newest checkpoint falls back to the previous one with a warning."""
    plan_dir, uninterrupted, _ = layout_runs("tp2-pp2-sp")
    run = tmp_path / "run"
    p = train(plan_dir, 4, run, "--save-interval", "2", "--keep", "2", "--fail-after-step", "4",
              expect_ok=False)
    assert p.returncode != 0
    assert sorted(metrics(run)) == [1, 2, 3, 4]
    assert checkpoints(run) == ["step00000002", "step00000004"]

    damaged = tmp_path / "damaged"
    shutil.copytree(run, damaged)

    train(plan_dir, 4, run, "--save-interval", "2", "--keep", "2")
    assert losses(run) == uninterrupted
    # keep 2: step 2 pruned, the final checkpoint written
    assert checkpoints(run) == ["step00000004", "step00000006"]

    victim = next(p for p in sorted((damaged / "checkpoints" / "step00000004").rglob("*.pt")))
    victim.write_bytes(victim.read_bytes()[:100])  # a truncated write
    p = train(plan_dir, 4, damaged, "--keep", "2")
    assert "step00000004 is damaged" in p.stderr + p.stdout
    assert "resumed from" in p.stdout and "step00000002" in p.stdout
    assert losses(damaged) == uninterrupted


def test_bf16_accumulates_in_fp32_and_resumes_exactly(tmp_path, reference):
    """bf16 with several micro-batches per step: the plan accumulates gradients in fp32
    (data_types.grad_accum_dtype; at ZeRO-1 DeepSpeed's BF16_Optimizer with immediate_grad_update),
    DeepSpeed's pipeline engine trains with it, the losses follow the fp32 run within bf16's
    precision, and a run killed after step 3 resumes to the uninterrupted run's losses exactly."""
    from click.testing import CliRunner

    from orchestrator.cli.main import main

    spec = tmp_path / "tiny-bf16.yaml"
    spec.write_text(TINY.read_text().replace("precision: fp32", "precision: bf16"))
    plan_dir = tmp_path / "plan"
    r = CliRunner().invoke(main, ["plan", str(spec), "--cluster", "local", "--out", str(plan_dir), "--tp", "1",
                                  "--pp", "2", "--dp", "2", "--zero", "1", "--mbs", "2"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    cfg = json.loads((plan_dir / "ds_config.json").read_text())
    assert cfg["gradient_accumulation_steps"] == 4
    assert cfg["data_types"] == {"grad_accum_dtype": "fp32"} and cfg["bf16"]["immediate_grad_update"] is True
    full = tmp_path / "full"
    train(plan_dir, 4, full)
    got = losses(full)
    assert len(got) == STEPS and all(math.isfinite(x) for x in got)
    # bf16 weights and activations: within 2% of the fp32 single-process run.
    assert all(abs(a - b) <= 0.02 * b for a, b in zip(got, reference)), (got, reference)
    run = tmp_path / "run"
    p = train(plan_dir, 4, run, "--save-interval", "3", "--fail-after-step", "3", expect_ok=False)
    assert p.returncode != 0 and sorted(metrics(run)) == [1, 2, 3]
    train(plan_dir, 4, run)
    assert losses(run) == got


def test_disk_full_during_a_checkpoint_keeps_the_previous_one(tmp_path, layout_runs):
    """The run directory on a 5 MB filesystem (a tmpfs, mounted for the test: root only): the
    checkpoint of step 2 (3.5 MB) fits, the one of step 4 runs out of space. The run fails with
    ENOSPC; the step-2 checkpoint stays intact; with space again the same command resumes from it
    (the half-written step-4 checkpoint is skipped as damaged) and ends with the uninterrupted run's
    losses."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root, as CI has): {r.stderr.strip()}")
    try:
        plan_dir, uninterrupted, _ = layout_runs("dp2-zero1")
        run = mnt / "run"
        p = train(plan_dir, 2, run, "--save-interval", "2", expect_ok=False)
        assert p.returncode != 0
        assert "saving checkpoint step00000004" in p.stdout + p.stderr and "the disk is full" in p.stdout + p.stderr
        from orchestrator.train.checkpoint.store import damage

        ckpts = run / "checkpoints"
        assert damage(ckpts / "step00000002") is None
        assert damage(ckpts / "step00000004") is not None
        subprocess.run(["mount", "-o", "remount,size=64m", str(mnt)], check=True)
        p = train(plan_dir, 2, run, "--save-interval", "2")
        assert "step00000004 is damaged" in p.stdout + p.stderr and "step00000002" in p.stdout
        assert losses(run) == uninterrupted
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_launch_script_trains_on_real_text(tmp_path):
    """The example of docs/tutorials/first-run.md: the default local plan's launch.sh (torchrun,
    4 ranks) on the shipped corpus; the loss falls well below its starting value within 25 steps."""
    plan_dir = plan(tmp_path / "tiny")
    env = clean_env(MASTER_PORT=str(_free_port()))
    p = subprocess.run(["bash", str(plan_dir / "launch.sh"), "--steps", "25", "--data", str(CORPUS),
                        "--no-save"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert "global 16 = micro-batch" in p.stdout  # the batch arithmetic is printed at start
    got = losses(plan_dir / "run")
    assert len(got) == 25
    assert got[0] > 5.3 and min(got[-5:]) < 4.0, got
    assert sum(got[-5:]) / 5 < got[0] - 1.5, got


def test_plan_for_another_world_size_is_refused(tmp_path):
    plan_dir = plan(tmp_path / "p", "--gpus-per-node", "2", "--dp", "2")
    p = train(plan_dir, 1, tmp_path / "run", expect_ok=False)
    assert p.returncode != 0
    assert "the plan is for 2 ranks" in p.stdout + p.stderr


def test_token_file_round_trip(tmp_path):
    """scripts/make_token_file.py output is what data.TokenFile reads; samples are windows."""
    import numpy as np

    from orchestrator.train.data.datasets import TokenFile, micro_batches

    text = tmp_path / "t.txt"
    text.write_text("hello world, " * 200, encoding="utf-8")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_token_file.py"), str(text),
                    "--out", str(tmp_path / "t")], check=True, capture_output=True)
    ds = TokenFile(tmp_path / "t", vocab_size=256, seq_length=16, seed=1)
    s = ds.sample(3)
    assert len(s) == 17 and bytes(s.astype(np.uint8)).decode() in ("hello world, " * 3) * 2
    # the global batch of a step is the same samples for any dp / micro-batch split
    one = [x for x, _ in micro_batches(ds, 2, 8, 1, 1, 0)]
    two = [x for r in (0, 1) for x, _ in micro_batches(ds, 2, 8, 2, 2, r)]
    key = lambda xs: sorted(tuple(row.tolist()) for x in xs for row in x)  # noqa: E731
    assert key(one) == key(two)


def test_trains_on_an_indexed_dataset(tmp_path):
    """--data PREFIX: a Megatron-LM indexed dataset (the shipped corpus rewritten as one, cut into
    documents of 4,096 tokens); 2 ranks train on its train part and evaluate on its valid part."""
    import numpy as np

    from orchestrator.train.data.indexed import IndexedWriter

    tokens = np.fromfile(CORPUS.with_suffix(".bin"), dtype="<u2")
    ends = np.arange(4096, len(tokens), 4096)
    with IndexedWriter(tmp_path / "pydoc", np.uint16) as w:
        for doc in np.split(tokens, ends):
            if len(doc):
                w.add_document(doc)
        w.finish()
    plan_dir = plan(tmp_path / "p", "--gpus-per-node", "2", "--dp", "2")
    p = train(plan_dir, 2, tmp_path / "run", "--data", str(tmp_path / "pydoc"), "--no-save")
    assert f"data: indexed train part: 1 {tmp_path / 'pydoc'}" in p.stdout, p.stdout[-2000:]
    got = losses(tmp_path / "run")
    assert len(got) == STEPS and all(math.isfinite(x) for x in got) and got[-1] < got[0], got


def test_slurm_environment_is_read():
    from orchestrator.train.loop.hosts import first_host
    from orchestrator.train.loop.launch import read_env

    e = read_env({"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8",
                  "SLURM_JOB_NODELIST": "gpu[003-004]", "SLURM_JOB_ID": "4242"})
    assert (e.rank, e.local_rank, e.world_size, e.launcher) == (5, 1, 8, "slurm")
    assert e.master_addr == "gpu003" and e.master_port == 20000 + 4242
    assert first_host("node7,login1") == "node7"
    t = read_env({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "SLURM_PROCID": "0",
                  "SLURM_NTASKS": "1"})
    assert (t.rank, t.launcher) == (1, "torchrun")  # torchrun inside an allocation wins


def test_replan_reshards_the_checkpoint_for_another_world(tmp_path, reference):
    """tp2 x pp2 (ZeRO-1) on 4 ranks, stopped after step 3; `dsorch replan` for 2 ranks, as
    tp1 x pp2 and as dp2, converts its checkpoint (DeepSpeed's universal checkpoint). Each resumed
    run continues the uninterrupted loss curve (the single-process reference every layout matches),
    with no step lost or repeated, in the same metrics.jsonl."""
    from click.testing import CliRunner

    from orchestrator.cli.main import main

    src = plan(tmp_path / "plans" / "a", "--tp", "2", "--pp", "2", "--dp", "1", "--zero", "1")
    run = tmp_path / "run"
    train(src, 4, run, "--steps", "3")
    for name, pins, expected in [("pp2", ["--tp", "1", "--pp", "2"], dict(tp=1, pp=2, dp=1)),
                                 ("dp2", ["--tp", "1", "--pp", "1"], dict(tp=1, pp=1, dp=2))]:
        resumed = tmp_path / f"run-{name}"
        shutil.copytree(run, resumed)
        out = tmp_path / "plans" / f"a-{name}"
        r = CliRunner().invoke(main, ["replan", str(resumed), "--gpus-per-node", "2", "--out", str(out), *pins])
        assert r.exit_code == 0, r.output
        assert "checkpoint of step 3, layout tp2+sp pp2 dp1 zero1" in r.output
        import yaml

        layout = yaml.safe_load((out / "plan.yaml").read_text())["layout"]
        assert {k: layout[k] for k in expected} == expected and layout["zero_stage"] in (1, 2)
        p = train(out, 2, resumed)
        assert f"resuming from {resumed / 'checkpoints' / 'universal_step00000003'}" in p.stdout, p.stdout[-2000:]
        m = metrics(resumed)
        assert sorted(m) == list(range(1, STEPS + 1))
        assert losses(resumed) == pytest.approx(reference, rel=RTOL), name
        assert [m[s]["layout"]["tp"] for s in sorted(m)] == [2, 2, 2, 1, 1, 1]
        assert "step00000006" in checkpoints(resumed)  # native checkpoints of the new layout from here on


def test_a_checkpoint_of_another_layout_is_refused_without_conversion(tmp_path):
    """The newest checkpoint was written by another layout and nothing converted it: resuming is an
    error that names `dsorch replan`, not a silent fall-back to an older checkpoint."""
    from orchestrator.train.checkpoint import store as checkpoint

    ckpt = tmp_path / "checkpoints"
    for step, tp in ((2, 1), (4, 2)):
        d = ckpt / checkpoint.tag_for(step)
        d.mkdir(parents=True)
        (d / "x.pt").write_bytes(b"x")
        (d / checkpoint.MANIFEST).write_text(json.dumps({"step": step, "files": checkpoint.file_digests(d),
                                                         "layout": {"tp": tp}, "plan": "p"}))
    tag, universal, error = checkpoint._choose(ckpt, {"tp": 1}, "dense")
    assert tag is None and "written by another layout" in error and "dsorch replan" in error
    assert checkpoint._choose(ckpt, {"tp": 2}, "dense") == ("step00000004", False, None)


def test_what_universal_checkpoints_cannot_convert_is_named():
    from orchestrator.plan.layout import Layout
    from orchestrator.train.checkpoint.reshard import convertible

    def lay(zero):
        return Layout(tp=1, pp=1, dp=2, vpp=1, zero_stage=zero, micro_batch_size=1, grad_accum_steps=8,
                      recompute="none", sequence_parallel=False)

    assert convertible(lay(1), lay(2)) == []
    assert "ZeRO-0" in convertible(lay(0), lay(1))[0] and "ZeRO-3" in convertible(lay(1), lay(3))[0]


def test_imported_architectures_train_and_match_across_layouts(tmp_path):
    """The blocks `dsorch import-hf` brings in (Gemma's GeGLU, Qwen2's QKV-only biases, GPT-NeoX's
    parallel residual with LayerNorm): every parameter the spec counts exists in the model, and a
    tp2 x pp2 run gives the single-process losses."""
    import yaml
    from click.testing import CliRunner

    from orchestrator.cli.main import main
    from orchestrator.plan.layout import Layout
    from orchestrator.spec.model import SpecFile
    from orchestrator.train.model.decoder import layer_specs
    from orchestrator.train.model.tensor_parallel import TPContext

    doc = yaml.safe_load(TINY.read_text())
    doc["name"] = "tiny-variants"
    doc["model"].update(activation="geglu", qkv_bias=True, parallel_residual=True, normalization="layernorm")
    spec_path = tmp_path / "variants.yaml"
    spec_path.write_text(yaml.safe_dump(doc))
    spec = SpecFile.model_validate(doc)
    single = Layout(tp=1, pp=1, dp=1, vpp=1, zero_stage=0, micro_batch_size=16, grad_accum_steps=1,
                    recompute="none", sequence_parallel=False)
    tp = TPContext(None, False)
    built = sum(p.numel() for s in layer_specs(spec.model, 64, single, tp, 1234) for p in s.build().parameters())
    assert built == spec.model.num_params

    def planned(out, *pins):
        r = CliRunner().invoke(main, ["plan", str(spec_path), "--cluster", "local", "--out", str(out), *pins],
                               catch_exceptions=False)
        assert r.exit_code == 0, r.output
        return out

    train(planned(tmp_path / "single", "--gpus-per-node", "1"), 1, tmp_path / "r1", "--no-save")
    train(planned(tmp_path / "tp2pp2", "--tp", "2", "--pp", "2", "--dp", "1"), 4, tmp_path / "r4", "--no-save")
    ref = losses(tmp_path / "r1")
    assert len(ref) == STEPS and ref[-1] < ref[0]
    assert losses(tmp_path / "r4") == pytest.approx(ref, rel=RTOL)
