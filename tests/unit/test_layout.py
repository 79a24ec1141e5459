"""One home for each parallel axis, plan/layout.py's AXES: every Layout field is carried, unchanged,
from the CLI pins through the plan directory, its regenerate line, a calibration record and the
pins of a trial or re-plan. The CLI words are made from the axis table, so a new axis is covered
without editing this file."""

from __future__ import annotations

import dataclasses
import json
import shlex

import pytest
import yaml

from orchestrator.calibrate.records import RecordLayout, record_rows, run_record
from orchestrator.cli.main import main
from orchestrator.costmodel import Candidates
from orchestrator.plan.layout import AXES, PINNABLE, Layout, Pins
from orchestrator.plan.solver import enumerate_layouts, search
from orchestrator.plandir.reader import PlanLayout, load_plan_dir
from orchestrator.spec.cluster import load_profile
from orchestrator.spec.model import load_spec

from ..conftest import EXAMPLES

# A layout with every axis away from its neutral value, legal with Megatron-LM on 16 DGX H100 nodes
# (128 GPUs = tp8 x cp2 x pp4 x dp2; the expert mesh etp2 x ep4 out of tp8 x cp2 x dp2) for Llama 3
# 70B made a mixture of eight experts (top 2, each an eighth of the MLP), so that ep and etp apply.
EVERY_AXIS = Layout(tp=8, sequence_parallel=True, cp=2, ep=4, etp=2, pp=4, vpp=2, dp=2, zero_stage=1,
                    micro_batch_size=1, grad_accum_steps=256, recompute="full", recompute_layers=3)
DENSE = EXAMPLES / "llama3-70b.yaml"


@pytest.fixture
def SPEC(tmp_path):
    doc = yaml.safe_load(DENSE.read_text())
    doc["name"] = "llama3-70b-moe8"
    doc["model"]["moe"] = {"num_experts": 8, "top_k": 2, "ffn_hidden_size": doc["model"]["ffn_hidden_size"] // 8}
    path = tmp_path / "llama3-70b-moe8.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _cli_words(layout: Layout) -> list[str]:
    """The pin options of every pinnable axis, spelt from the table's flags."""
    words = []
    for a in PINNABLE:
        value = getattr(layout, a.name)
        if a.kind is bool:
            on, off = a.flag.split("/")
            words.append(on if value else off)
        else:
            words += [a.flag, str(value)]
    return words


def test_every_axis_is_away_from_neutral_and_every_field_has_a_row(SPEC):
    assert [a.name for a in AXES] == [f.name for f in dataclasses.fields(Layout)]
    assert all(getattr(EVERY_AXIS, a.name) != a.neutral for a in AXES)
    assert EVERY_AXIS.global_batch_size == load_spec(SPEC)[0].training.global_batch_size


def test_schemas_and_columns_are_the_table():
    names = [a.name for a in AXES]
    assert list(PlanLayout.model_fields) == names
    assert list(RecordLayout.model_fields) == names
    assert [f.name for f in dataclasses.fields(Pins)] == [a.name for a in PINNABLE]
    assert set(names) <= {f.name for f in dataclasses.fields(Candidates)}
    # The keys' descriptions in files (docs/reference/plan-yaml.md) are the axes' docs, not the CLI help.
    for schema in (PlanLayout, RecordLayout):
        assert [f.description for f in schema.model_fields.values()] == [a.doc for a in AXES]
    assert all(a.doc and a.doc != a.help for a in AXES)


def test_a_layout_round_trips_through_pins_plan_regenerate_line_records_and_trial_pins(in_tmp, runner, SPEC):
    first = in_tmp / "first"
    r = runner.invoke(main, ["plan", str(SPEC), "--cluster", "dgx16", "--runtime", "megatron", "--out", str(first),
                             *_cli_words(EVERY_AXIS)])
    assert r.exit_code == 0, r.output
    pd = load_plan_dir(first)
    assert pd.layout == EVERY_AXIS

    # The regenerate line plan.yaml records, run as written: the same layout, the same files.
    header = (first / "plan.yaml").read_text().splitlines()[1]
    command = header.split("Regenerate (model spec path relative to this directory): ", 1)[1]
    words = shlex.split(command.replace("<this dir>", shlex.quote(str(first))))
    assert words[:2] == ["dsorch", "plan"]
    words = words[2:]
    words[0] = str((first / words[0]).resolve())  # the spec path is relative to the plan directory
    again = runner.invoke(main, ["plan", *words, "--check"])
    assert again.exit_code == 0, again.output
    assert set(Pins.of(EVERY_AXIS).words()) <= set(shlex.split(command))

    # plan.yaml's layout section states every axis.
    doc = yaml.safe_load((first / "plan.yaml").read_text())
    assert Layout(**doc["layout"]) == EVERY_AXIS

    # A calibration record of a run of this plan, and its row's pins.
    metrics = in_tmp / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": i, "step_time_s": 1.0}) + "\n" for i in range(1, 6)))
    record = run_record(metrics, first)
    assert Layout(**record.layout.model_dump()) == EVERY_AXIS
    (row,) = record_rows([record], load_profile("dgx16").profile)
    assert row.pins == Pins.of(EVERY_AXIS)

    # A trial's (and a re-plan's) pins make the search evaluate exactly this layout.
    spec = pd.spec
    cand, _ = enumerate_layouts(spec.model, spec.training, load_profile("dgx16").profile, "megatron",
                                Pins.of(EVERY_AXIS))
    assert len(cand) == 1
    best = search(spec.model, spec.training, load_profile("dgx16").profile, "megatron", Pins.of(EVERY_AXIS),
                  keep=1, memory_margin_gib=-1000.0).best
    assert best is not None and best.layout == EVERY_AXIS


def test_the_regenerate_line_names_every_pin(in_tmp, runner, SPEC):
    """The bug this table fixed: a plan made with --cp 2 recorded a regenerate line without --cp,
    and running that line picked another cp."""
    out = in_tmp / "cp2"
    r = runner.invoke(main, ["plan", str(SPEC), "--cluster", "dgx16", "--runtime", "megatron", "--cp", "2",
                             "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "--cp 2" in (out / "plan.yaml").read_text().splitlines()[1]
    assert "--cp 2" in (out / "plan.md").read_text()


def test_short_form_and_pins_of_a_layout():
    assert EVERY_AXIS.short() == "tp8+sp cp2 ep4 etp2 pp4 vpp2 dp2 zero1 mbs1 gas256 rc=full/3"
    plain = dataclasses.replace(EVERY_AXIS, sequence_parallel=False, cp=1, vpp=1, ep=1, etp=1, recompute_layers=0)
    assert plain.short() == "tp8 pp4 dp2 zero1 mbs1 gas256 rc=full"
    assert Pins.of(EVERY_AXIS).all_pinned() and not Pins(tp=8).all_pinned()
    assert Pins(tp=8, cp=2).words() == ["--tp", "8", "--cp", "2"]
    assert Pins(sequence_parallel=False).words() == ["--no-sp"]
