"""Evaluation and TensorBoard in the bundled entrypoint, 2 CPU ranks: validation loss every
data.eval_interval steps and after the last planned step (train/loop/validation.py), the same in a
data-parallel and a pipeline layout (DeepSpeed's PipelineEngine.eval_batch), written to
metrics.jsonl and a TensorBoard event file, and training unchanged by it. About a minute on 2 cores.
"""

from __future__ import annotations

import json
import math

import pytest

from .test_train import RTOL, TINY, train

STEPS = 4


def _spec(tmp_path, eval_iters: int, tensorboard: bool):
    text = TINY.read_text().replace("train_tokens: 30720", f"steps: {STEPS}")
    text = text.replace("warmup_steps: 5", "warmup_steps: 1")
    text += f"  data: {{eval_interval: 2, eval_iters: {eval_iters}}}\n"
    if tensorboard:
        text += "  logging: {tensorboard: true}\n"
    path = tmp_path / f"tiny-eval{eval_iters}.yaml"
    path.write_text(text)
    return path


def _run(tmp_path, name, spec, *pins):
    """Plan SPEC with PINS into tmp_path/name, train it on 2 ranks; its metrics.jsonl records."""
    from click.testing import CliRunner

    from orchestrator.cli.main import main

    d = tmp_path / name
    r = CliRunner().invoke(main, ["plan", str(spec), "--cluster", "local", "--out", str(d / "plan"),
                                  "--gpus-per-node", "2", *pins], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    p = train(d / "plan", 2, d / "run", "--no-save", "--steps", str(STEPS))
    records = [json.loads(x) for x in (d / "run" / "metrics.jsonl").read_text().splitlines()]
    return d / "run", records, p.stdout


def test_eval_records_layouts_and_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    spec = _spec(tmp_path, eval_iters=2, tensorboard=True)
    dp_run, dp, dp_log = _run(tmp_path, "dp2", spec, "--dp", "2", "--zero", "1")
    pp_run, pp, _ = _run(tmp_path, "pp2", spec, "--tp", "1", "--pp", "2", "--dp", "1")
    plain_run, plain, _ = _run(tmp_path, "dp2-noeval", _spec(tmp_path, eval_iters=0, tensorboard=False),
                               "--dp", "2", "--zero", "1")

    def evals(recs):
        return [(r["step"], r["final"], r["eval_loss"]) for r in recs if r.get("kind") == "eval"]

    def steps(recs):
        return [r["loss"] for r in recs if "kind" not in r]

    # After steps 2 and 4 on the interval, then once more after the last planned step.
    assert [(s, f) for s, f, _ in evals(dp)] == [(2, False), (4, False), (4, True)]
    assert "validation after training | loss" in dp_log
    for r in dp:
        if r.get("kind") == "eval":
            assert r["eval_ppl"] == pytest.approx(math.exp(r["eval_loss"])) and r["eval_iters"] == 2
    # Untrained byte model: about ln 256; each evaluation reads other batches, all finite.
    assert all(0 < loss < 7 for _, _, loss in evals(dp))
    # The pipeline's eval_batch and the data-parallel forward give the same validation loss.
    for (_, _, a), (_, _, b) in zip(evals(dp), evals(pp), strict=True):
        assert a == pytest.approx(b, rel=RTOL)
    # Evaluating changes nothing in training: the same layout without it has the same losses, bit for bit.
    assert steps(dp) == steps(plain) and len(steps(dp)) == STEPS
    assert evals(plain) == [] and not (plain_run / "tensorboard").exists()

    acc = EventAccumulator(str(dp_run / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3, 4]
    assert [e.value for e in acc.Scalars("train/loss")] == pytest.approx(steps(dp), rel=1e-6)
    assert [e.step for e in acc.Scalars("eval/loss")] == [s for s, _, _ in evals(dp)]
    assert [e.value for e in acc.Scalars("eval/loss")] == pytest.approx([v for _, _, v in evals(dp)], rel=1e-6)
    # Steps 1 and 2 of a 1-step warmup: rate 0 (Megatron-LM's --lr-warmup-init), then the full lr.
    assert [r["lr"] for r in dp if "kind" not in r][:2] == [0.0, 3.0e-3]
    assert pp_run.exists()
