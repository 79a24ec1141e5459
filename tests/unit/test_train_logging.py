"""Logs people look at: the schedule and logging flags Megatron-LM gets, the TensorBoard and W&B
sinks (train/loop/sinks.py), evaluation records in metrics.jsonl and where `dsorch status` reads them."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from orchestrator.calibrate.records import last_records, read_steps
from orchestrator.errors import InvalidFile
from orchestrator.plan.layout import Layout
from orchestrator.render.megatron import megatron_flags, render_megatron_args
from orchestrator.runtimes import runtime_named
from orchestrator.spec.cluster import load_profile
from orchestrator.spec.model import SpecFile
from orchestrator.spec.training import LoggingSpec, WandbSpec
from orchestrator.train.loop import sinks
from orchestrator.validate.megatron import check_megatron_args, parse_args_lines

from ..conftest import EXAMPLES

LAYOUT = Layout(
    tp=1, pp=2, dp=2, vpp=1, zero_stage=1, micro_batch_size=1, grad_accum_steps=8, recompute="none",
    sequence_parallel=False, cp=1, ep=1, etp=1,
)  # fmt: skip


def _plan(training: dict, runtime: str = "megatron"):
    """A stand-in for a Plan (what megatron_flags reads), from examples/tiny.yaml with changes."""
    import yaml

    doc = yaml.safe_load((EXAMPLES / "tiny.yaml").read_text())
    doc["training"] = doc["training"] | training
    spec = SpecFile.model_validate(doc)
    # checkpoint: a stand-in for Plan.checkpoint (tested in test_checkpoint_interval.py), fixed here.
    return SimpleNamespace(
        spec=spec,
        layout=LAYOUT,
        runtime=runtime_named(runtime),
        profile=load_profile("local").profile,
        checkpoint=SimpleNamespace(steps=1000),
    )


def _checked(plan) -> dict[str, str | None]:
    flags = parse_args_lines(render_megatron_args(plan))
    assert check_megatron_args(flags, LAYOUT.world_size) == []  # Megatron-LM's own argument table
    return dict(megatron_flags(plan))


@pytest.mark.parametrize("style", ["cosine", "linear", "constant"])
def test_decay_style_reaches_megatron(style):
    opt = {"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 5, "decay_style": style}
    f = _checked(_plan({"optimizer": opt}))
    assert f["--lr-decay-style"] == style and f["--lr-warmup-iters"] == "5" and f["--train-iters"] == "30"
    assert "--lr-wsd-decay-iters" not in f


def test_wsd_reaches_megatron_with_its_anneal():
    opt = {"warmup_steps": 5, "decay_style": "WSD", "wsd_decay_steps": 10, "wsd_decay_style": "minus_sqrt"}
    f = _checked(_plan({"optimizer": opt}))
    assert (f["--lr-decay-style"], f["--lr-wsd-decay-style"], f["--lr-wsd-decay-iters"]) == ("WSD", "minus_sqrt", "10")


def test_logging_reaches_megatron_beside_its_checkpoints():
    logging = {"tensorboard": True, "wandb": {"project": "llm", "mode": "offline"}}
    f = _checked(_plan({"logging": logging}))
    assert f["--tensorboard-dir"] == "checkpoints/tensorboard" and "--log-validation-ppl-to-tensorboard" in f
    assert (f["--wandb-project"], f["--wandb-exp-name"], f["--wandb-save-dir"]) == ("llm", "tiny", "checkpoints/wandb")
    # The deepspeed runtime's megatron_args.txt is the model's description only: no logging flags.
    assert "--tensorboard-dir" not in dict(megatron_flags(_plan({"logging": logging}, "deepspeed")))


def test_a_missing_extra_is_named_with_its_install_command(monkeypatch):
    monkeypatch.setattr(sinks.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(InvalidFile, match=r"training.logging.wandb is set but the wandb package.*dsorch\[wandb\]"):
        sinks.check_available(LoggingSpec(wandb=WandbSpec(project="p")), "plans/x")
    sinks.check_available(LoggingSpec(), "plans/x")  # nothing asked, nothing needed


def _metrics_log(tmp_path, logging: LoggingSpec):
    from orchestrator.plandir.rundir import RunDir
    from orchestrator.train.loop.metrics import MetricsLog

    plan = _plan({})
    plan.doc = SimpleNamespace(cluster=SimpleNamespace(peak_tflops=None))
    log = MetricsLog(RunDir(tmp_path), plan, 4, sinks.Sinks(logging, tmp_path, "tiny", {"k": 1}))
    for step in (1, 2):
        log.record(step, 5.0 - step, 1e-3 * step, 0.5, 0.1, 1.0, "cpu_peak_rss")
    log.record_eval(2, 3.25, 4, 0.3, final=False)
    log.record(3, 1.5, 3e-3, None, 0.1, 1.0, "cpu_peak_rss")
    log.record_eval(3, 3.0, 4, 0.3, final=True)
    log.close()
    return RunDir(tmp_path).metrics


def test_eval_records_stand_apart_from_step_records(tmp_path):
    metrics = _metrics_log(tmp_path, LoggingSpec())
    assert [r["step"] for r in read_steps(metrics)] == [1, 2, 3]  # calibrate reads steps only
    last, ev = last_records(metrics)
    assert last is not None and last["loss"] == 1.5
    assert ev == {
        "kind": "eval", "step": 3, "eval_loss": 3.0, "eval_ppl": math.exp(3.0), "eval_iters": 4,
        "eval_time_s": 0.3, "final": True,
    }  # fmt: skip

    from orchestrator.run.submission import eval_text, latest_eval

    assert eval_text(latest_eval(tmp_path)) == f"3.0000 ({math.exp(3.0):.4g}) @ 3"
    assert latest_eval(tmp_path / "nowhere") is None


def test_tensorboard_event_file_carries_the_metrics(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _metrics_log(tmp_path, LoggingSpec(tensorboard=True))
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert scalars["train/loss"] == [(1, 4.0), (2, 3.0), (3, 1.5)]
    assert [s for s, _ in scalars["train/lr"]] == [1, 2, 3] and scalars["train/lr"][1][1] == pytest.approx(2e-3)
    assert scalars["eval/loss"] == [(2, 3.25), (3, 3.0)]
    assert scalars["eval/ppl"][0][1] == pytest.approx(math.exp(3.25), rel=1e-6)
    assert [s for s, _ in scalars["train/grad_norm"]] == [1, 2]  # step 3 had no norm: nothing written


def test_wandb_offline_writes_its_run_without_network(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    # No network and no account: offline mode must not try either.
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    _metrics_log(tmp_path, LoggingSpec(wandb=WandbSpec(project="dsorch-test", mode="offline")))
    runs = list((tmp_path / "wandb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((tmp_path / "wandb").rglob("*"))
    assert list(runs[0].glob("*.wandb")), "the offline run has no event log"


def test_status_table_shows_the_latest_eval():
    from orchestrator.cli.console import job_table

    rec = SimpleNamespace(
        job_id="7", cluster="local", plan_dir="plans/tiny", state="RUNNING", elapsed_s=5.0, requeues=0,
        last_step=3, last_loss=1.5, submitted_at="2026-01-01T00:00:00+00:00",
    )  # fmt: skip
    from rich.console import Console

    con = Console(width=200, record=True)
    con.print(job_table([rec], ["3.0000 (20.09) @ 3"]))
    text = con.export_text()
    assert "eval loss (ppl)" in text and "3.0000 (20.09) @ 3" in text
