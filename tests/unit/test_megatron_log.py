"""Megatron-LM's log lines become metrics.jsonl step records (orchestrator/run/megatron_log.py).

The lines are built with the format strings of Megatron-LM d98e8a6 itself: training.py training_log
(the iteration line) and utils/common_utils.py report_memory (the memory line)."""

from __future__ import annotations

import json

import pytest

from orchestrator.calibrate.records import last_records, read_steps
from orchestrator.run.megatron_log import MegatronLog, parse_iteration, parse_memory, records_of, write_peak


def iteration_line(iteration, train_iters, consumed, ms, lr=None, batch=32, losses=(("lm loss", 7.0123),),
                   grad_norm=3.21, throughput=None, skipped_samples=0):
    """training_log's line, format string by format string (training.py, d98e8a6)."""
    log_string = " [2026-12-03 15:01:02.123456]"
    log_string += ' iteration {:8d}/{:8d} |'.format(iteration, train_iters)
    log_string += ' consumed samples: {:12d} |'.format(consumed)
    if skipped_samples > 0:
        log_string += ' skipped samples: {:12d} |'.format(skipped_samples)
    log_string += ' elapsed time per iteration (ms): {:.1f} |'.format(ms)
    if throughput is not None:
        log_string += f' throughput per GPU (TFLOP/s/GPU): {throughput:.1f} |'
    if lr is not None:
        log_string += f' learning rate: {lr:.6E} |'
    log_string += f' global batch size: {batch:5d} |'
    for key, avg in losses:
        log_string += ' {}: {:.6E} |'.format(key, avg)
    log_string += f' loss scale: {1.0:.1f} |'
    if grad_norm is not None:
        log_string += f' grad norm: {grad_norm:.3f} |'
    log_string += ' number of skipped iterations: {:3d} |'.format(0)
    log_string += ' number of nan iterations: {:3d} |'.format(0)
    return log_string


def memory_line(rank, name, allocated_mb, max_allocated_mb):
    """report_memory's line (utils/common_utils.py, d98e8a6)."""
    string = name + ' memory (MB)'
    string += f" | allocated: {allocated_mb:.2f}"
    string += f" | max allocated: {max_allocated_mb:.2f}"
    string += f" | reserved: {max_allocated_mb * 1.1:.2f}"
    string += f" | max reserved: {max_allocated_mb * 1.2:.2f}"
    return "[Rank {}] {}".format(rank, string)


def test_an_iteration_line_is_a_step_record():
    rec = parse_iteration(iteration_line(10, 100, 320, 1234.5, lr=1e-4, losses=(("lm loss", 7.0123),
                                                                                  ("mtp_1 loss", 7.5))))
    assert rec == {"step": 10, "train_iters": 100, "consumed_samples": 320, "step_time_s": pytest.approx(1.2345),
                   "lr": pytest.approx(1e-4), "loss": pytest.approx(7.0123), "grad_norm": pytest.approx(3.21)}


def test_optional_fields_come_and_go():
    """No learning rate (not the first or last pipeline stage), no grad norm, skipped samples and
    --log-throughput: the record has what the line has, a loss of None where it has no lm loss."""
    rec = parse_iteration(iteration_line(3, 5, 96, 80.0, grad_norm=None, throughput=412.3, skipped_samples=4,
                                         losses=()))
    assert rec["step"] == 3 and rec["tflops_per_gpu"] == pytest.approx(412.3)
    assert rec["loss"] is None and "lr" not in rec and "grad_norm" not in rec


@pytest.mark.parametrize("line", [
    "[Rank 0] (after 1 iterations) memory (MB) | allocated: 1.00 | max allocated: 2.00",  # memory, not a step
    " saved checkpoint from iteration      10 to /ckpt [ t 1/1, p 1/1 ]",
    "training ...",
    " [2026-12-03 15:01:02] iteration        1/      10 | consumed samples:            1 |",  # no time: cut short
])
def test_other_lines_are_no_step(line):
    assert parse_iteration(line) is None


def test_a_memory_line_is_the_rank_and_its_peak_in_gib():
    assert parse_memory(memory_line(3, "(after 10 iterations)", 1000.0, 2048.0)) == (3, 2.0)
    assert parse_memory(memory_line(0, "(before save_checkpoint for iteration 20)", 1.0, 512.0)) == (0, 0.5)
    assert parse_memory(iteration_line(1, 2, 3, 4.0)) is None


def test_a_log_becomes_the_metrics_file_status_and_calibrate_read(tmp_path):
    """Peak memory: the largest report so far, here or in another node's file; the records are
    what calibrate/records.py reads (last_records for status, read_steps for calibrate and trial)."""
    metrics, peer, own = tmp_path / "metrics.jsonl", tmp_path / "peer.json", tmp_path / "own.json"
    log = MegatronLog(metrics, [peer, own, tmp_path / "absent.json"], own=own)
    lines = [
        "training ...",
        iteration_line(1, 3, 32, 900.0, lr=1e-4, losses=(("lm loss", 9.0),)),
        memory_line(0, "(after 1 iterations)", 100.0, 1024.0),
        memory_line(2, "(after 1 iterations)", 100.0, 1536.0),
        iteration_line(2, 3, 64, 500.0, lr=1e-4, losses=(("lm loss", 8.0),)),
    ]
    for line in lines:
        log.feed(line + "\n")
    assert json.loads(own.read_text()) == {"peak_mem_gib": 1.5}  # for the node that writes the records
    write_peak(peer, 4.0)  # another node's report
    log.feed(iteration_line(3, 3, 96, 510.0, lr=1e-4, losses=(("lm loss", 7.5),)))
    steps = read_steps(metrics)
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert [r.get("peak_mem_gib") for r in steps] == [None, 1.5, 4.0]
    assert steps[1]["mem_kind"] == "cuda_max_allocated"
    last, evaluation = last_records(metrics)
    assert last is not None and last["step"] == 3 and last["loss"] == pytest.approx(7.5) and evaluation is None
    assert [json.loads(x)["step"] for x in metrics.read_text().splitlines()] == [1, 2, 3]
    assert [r["step"] for r in records_of(lines)] == [1, 2]


@pytest.mark.parametrize("first", ["iteration", "memory"])
def test_two_reports_on_one_line_are_both_read(tmp_path, first):
    """Ranks share the node's stdout: an unbuffered print's text and newline are two writes, and
    another rank's report can land between them (the iteration line was lost that way)."""
    it = iteration_line(1, 3, 32, 900.0, lr=1e-4, losses=(("lm loss", 9.0),))
    mem = memory_line(0, "(after 1 iterations)", 100.0, 1024.0)
    log = MegatronLog(tmp_path / "metrics.jsonl")
    rec = log.feed((it + mem if first == "iteration" else mem + it) + "\n")
    assert rec is not None and rec["step"] == 1 and rec["loss"] == pytest.approx(9.0)
    assert log.peak_gib == pytest.approx(1.0)
    assert [r["step"] for r in records_of([it + mem, "", iteration_line(2, 3, 64, 500.0)])] == [1, 2]
