"""The spec's overrides: extra Megatron-LM flags and ds_config.json keys merged into the generated
files, validated like them by DeepSpeed's config classes and Megatron-LM's argument table, refused
where they would set the layout, recorded in plan.yaml's hashes and shown by `dsorch diff`."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from orchestrator.cli.main import main
from orchestrator.plandir.reader import load_plan_dir, sha256_text
from orchestrator.render.overrides import DS_CONFIG_OWNERS, FLAG_OWNERS, merge_ds_config, merge_flags
from orchestrator.spec.model import SpecFile
from orchestrator.spec.overrides import Overrides
from orchestrator.validate.megatron import known_flags, parse_args_lines
from orchestrator.validate.plan_dir import validate_path

OVERRIDES = {
    "megatron_args": ["--log-interval 5", "--seed=7", "--some-future-flag 3"],
    "ds_config": {
        "zero_optimization": {"overlap_comm": False},
        "wall_clock_breakdown": True,
        "tensorboard": {"enabled": True, "output_path": "tb"},
    },
}


def run(runner, *args):
    return runner.invoke(main, [*map(str, args)], catch_exceptions=False)


def spec_with(tmp: Path, overrides: dict | None, name: str = "tiny.yaml", base: str = "tiny.yaml") -> Path:
    doc = yaml.safe_load((Path("examples") / base).read_text())
    if overrides is not None:
        doc["overrides"] = overrides
    path = tmp / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


# ---- merging -----------------------------------------------------------------------------------


def test_a_flag_dsorch_emits_is_replaced_where_it_stands_and_new_flags_are_appended():
    ov = Overrides(megatron_args=("--seed 7", "--log-interval=5", "--use-flash-attn"))
    merged = merge_flags([("--lr", "0.1"), ("--seed", "1234"), ("--bf16", None)], ov)
    assert merged == [
        ("--lr", "0.1"),
        ("--seed", "7"),
        ("--bf16", None),
        ("--log-interval", "5"),
        ("--use-flash-attn", None),
    ]


def test_ds_config_keys_deep_merge_and_a_non_mapping_replaces():
    cfg = {"zero_optimization": {"stage": 1, "overlap_comm": True}, "bf16": {"enabled": True}, "x": {"a": 1}}
    ov = Overrides(ds_config={"zero_optimization": {"overlap_comm": False, "new": 2}, "x": 3, "y": None})
    assert merge_ds_config(cfg, ov) == {
        "zero_optimization": {"stage": 1, "overlap_comm": False, "new": 2},
        "bf16": {"enabled": True},
        "x": 3,
        "y": None,
    }
    assert cfg["zero_optimization"] == {"stage": 1, "overlap_comm": True}  # dsorch's config is not changed


@pytest.mark.parametrize(
    "items, words",
    [
        (["--wandb-project 'my run'"], 'holds "\'"'),
        (["log-interval 5"], "does not start with a flag"),
        (["--log-interval 5", "--log-interval=6"], "gives --log-interval again (first in megatron_args[0])"),
        (["--x $HOME"], "holds '$'"),
        ([""], "an empty item"),
    ],
)
def test_an_item_that_is_not_one_flag_is_refused_in_the_spec(items, words):
    with pytest.raises(ValueError, match=None) as e:
        Overrides(megatron_args=tuple(items))
    assert words in str(e.value)


def test_the_schema_takes_overrides_at_the_top_of_the_spec():
    doc = yaml.safe_load(Path(__file__).parents[2].joinpath("examples", "tiny.yaml").read_text())
    spec = SpecFile.model_validate({**doc, "overrides": OVERRIDES})
    assert spec.overrides.flags == [("--log-interval", "5"), ("--seed", "7"), ("--some-future-flag", "3")]
    assert SpecFile.model_validate(doc).overrides.empty


# ---- the plan directory ------------------------------------------------------------------------


def test_plan_writes_the_merged_files_lists_each_override_and_validates(runner, in_tmp):
    spec = spec_with(in_tmp, OVERRIDES)
    r = run(runner, "plan", spec, "--cluster", "local", "--out", in_tmp / "p")
    assert r.exit_code == 0, r.output
    assert "the spec's overrides set 7 values in the generated files" in r.output
    pd = load_plan_dir(in_tmp / "p")
    cfg = pd.ds_config
    assert cfg is not None and cfg["wall_clock_breakdown"] is True and cfg["tensorboard"]["output_path"] == "tb"
    assert cfg["zero_optimization"]["overlap_comm"] is False
    assert cfg["zero_optimization"]["stage"] == pd.layout.zero_stage  # dsorch's keys beside the override stay
    flags = parse_args_lines(pd.megatron_args)
    # --seed given again replaces dsorch's: one line, the override's value.
    assert [v for f, v in flags if f == "--seed"] == ["7"]
    assert flags[-2:] == [("--log-interval", "5"), ("--some-future-flag", "3")]
    # Recorded: the spec in plan.yaml carries them; plan.yaml's hashes are of the merged files.
    assert pd.spec.overrides.megatron_args == tuple(OVERRIDES["megatron_args"])
    assert pd.doc.files["ds_config.json"] == sha256_text((in_tmp / "p" / "ds_config.json").read_text())
    md = (in_tmp / "p" / "plan.md").read_text()
    assert "| megatron_args.txt | `--seed` | `1234` | `7` |" in md
    assert "| ds_config.json | `wall_clock_breakdown` | `false` | `true` |" in md
    assert "| megatron_args.txt | `--log-interval` | not set | `5` |" in md
    assert "`--some-future-flag` | not set | `3` (unchecked" in md
    assert "the flags apply when the spec is planned with `--runtime megatron`" in md
    # A flag the argument table does not know passes, said to be unchecked; the rest is checked.
    assert "--some-future-flag" not in known_flags()
    assert validate_path(in_tmp / "p") == []
    r = run(runner, "validate", in_tmp / "p")
    assert r.exit_code == 0 and "valid" in r.output
    assert "not checked: --some-future-flag (the spec's overrides)" in r.output


def test_the_same_inputs_give_byte_identical_files(runner, in_tmp):
    spec = spec_with(in_tmp, OVERRIDES)
    for out in ("a", "b"):
        assert run(runner, "plan", spec, "--cluster", "local", "--out", in_tmp / out).exit_code == 0
    names = sorted(p.name for p in (in_tmp / "a").iterdir())
    assert names == sorted(p.name for p in (in_tmp / "b").iterdir())
    for name in names:
        assert (in_tmp / "a" / name).read_bytes() == (in_tmp / "b" / name).read_bytes(), name
    # Planned again from what plan.yaml recorded (the spec with its overrides): no difference.
    r = run(runner, "plan", "--check", in_tmp / "a")
    assert r.exit_code == 0, r.output


def test_the_entrypoint_gives_deepspeed_the_overridden_config(runner, in_tmp):
    import torch

    from orchestrator.train.loop.entry import ds_config_for

    spec = spec_with(in_tmp, {"ds_config": {"optimizer": {"params": {"torch_adam": False}}, "steps_per_print": 3}})
    assert run(runner, "plan", spec, "--cluster", "local", "--out", in_tmp / "p").exit_code == 0
    cfg = ds_config_for(load_plan_dir(in_tmp / "p"), torch.device("cpu"))
    assert cfg["steps_per_print"] == 3
    assert cfg["optimizer"]["params"]["torch_adam"] is False  # the plan's word, not the CPU default
    assert cfg["optimizer"]["type"] == "AdamW"


def test_a_megatron_plan_checks_the_flags_and_says_ds_config_is_unused(runner, in_tmp):
    spec = spec_with(in_tmp, {"megatron_args": ["--log-interval 1", "--eval-iters 7"], "ds_config": {"x_y": 1}})
    r = run(runner, "plan", spec, "--cluster", "local", "--runtime", "megatron", "--out", in_tmp / "p")
    assert r.exit_code == 0, r.output
    flags = parse_args_lines((in_tmp / "p" / "megatron_args.txt").read_text())
    assert [v for f, v in flags if f == "--eval-iters"] == ["7"]
    md = (in_tmp / "p" / "plan.md").read_text()
    assert "A megatron plan has no ds_config.json: `overrides.ds_config` applies to `--runtime deepspeed`." in md
    assert validate_path(in_tmp / "p") == []


# ---- refused and invalid overrides -------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, words",
    [
        ({"megatron_args": ["--tensor-model-parallel-size 2"]}, "the layout's tp (pin it: `dsorch plan SPEC --tp N`)"),
        ({"megatron_args": ["--micro-batch-size 2"]}, "the layout's micro-batch (pin it: `dsorch plan SPEC --mbs N`)"),
        ({"megatron_args": ["--sequence-parallel"]}, "pin it: `dsorch plan SPEC --sp or --no-sp`"),
        ({"megatron_args": ["--global-batch-size 64"]}, "from the spec's training.global_batch_size"),
        ({"megatron_args": ["--num-layers 9"]}, "from the spec's model.num_layers"),
        ({"ds_config": {"train_micro_batch_size_per_gpu": 4}}, "the layout's micro-batch"),
        ({"ds_config": {"gradient_accumulation_steps": 4}}, "the global batch over --mbs x --dp: pin those"),
        (
            {"ds_config": {"zero_optimization": {"stage": 3}}},
            "the layout's ZeRO stage (pin it: `dsorch plan SPEC --zero N`)",
        ),
        # Replacing the mapping above a layout key replaces the key too.
        (
            {"ds_config": {"zero_optimization": None}},
            "overrides.ds_config.zero_optimization sets zero_optimization.stage",
        ),
        ({"ds_config": {"train_batch_size": 64}}, "the spec's training.global_batch_size"),
    ],
)
def test_what_the_layout_sets_is_refused_with_the_pin_to_use(runner, in_tmp, overrides, words):
    spec = spec_with(in_tmp, overrides)
    r = run(runner, "plan", spec, "--cluster", "local", "--out", in_tmp / "p")
    assert r.exit_code == 2, r.output
    assert words in r.output, r.output
    assert "drop them from overrides" in r.output and "Nothing was written." in r.output
    assert "Traceback" not in r.output
    assert not (in_tmp / "p").exists()


def test_a_value_deepspeed_refuses_names_the_spec_key_and_writes_nothing(runner, in_tmp):
    spec = spec_with(in_tmp, {"ds_config": {"zero_optimization": {"reduce_bucket_size": "lots"}, "steps_per_print": 5}})
    r = run(runner, "plan", spec, "--cluster", "local", "--zero", "1", "--out", in_tmp / "p")
    assert r.exit_code == 2, r.output
    out = " ".join(r.output.split())
    assert "DeepSpeed's DeepSpeedConfig rejects it" in out and "reduce_bucket_size" in out
    assert "Fix or remove overrides.ds_config.zero_optimization.reduce_bucket_size in the spec" in out
    assert "steps_per_print" not in out.split("Fix or remove")[1]  # the key at fault, not every key
    assert not (in_tmp / "p").exists()


def test_a_yaml_exponent_read_as_a_string_gets_the_yaml_fix(runner, in_tmp):
    spec = in_tmp / "t.yaml"
    spec.write_text(
        Path("examples/tiny.yaml").read_text() + "overrides:\n  ds_config:\n    zero_optimization:\n"
        "      reduce_bucket_size: 5e8\n"
    )
    r = run(runner, "plan", spec, "--cluster", "local", "--zero", "1", "--out", in_tmp / "p")
    assert r.exit_code == 2
    assert "in YAML, 5e8 is a string: write 500000000 or 5.0e+8" in " ".join(r.output.split())


def test_a_bad_flag_value_is_refused_by_the_argument_table(runner, in_tmp):
    spec = spec_with(in_tmp, {"megatron_args": ["--log-interval five", "--use-flash-attn 3", "--eval-iters 2"]})
    r = run(runner, "plan", spec, "--cluster", "local", "--out", in_tmp / "p")
    assert r.exit_code == 2, r.output
    out = " ".join(r.output.split())
    assert "--log-interval expects an integer, got 'five'" in out
    assert "--use-flash-attn is a switch and takes no value" in out
    assert (
        "Fix or remove overrides.megatron_args[0] (--log-interval), overrides.megatron_args[1] (--use-flash-attn)"
        in out
    )
    assert not (in_tmp / "p").exists()


def test_a_bad_item_names_its_line(runner, in_tmp):
    spec = in_tmp / "t.yaml"
    text = Path("examples/tiny.yaml").read_text()
    spec.write_text(text + "overrides:\n  megatron_args:\n    - --log-interval 5\n    - --wandb-project 'a b'\n")
    r = run(runner, "plan", spec, "--cluster", "local", "--out", in_tmp / "p")
    assert r.exit_code == 2
    assert f"t.yaml:{len(text.splitlines()) + 4}: key 'overrides.megatron_args.1'" in r.output


# ---- the tables of what the layout sets --------------------------------------------------------


def test_every_refused_flag_is_a_megatron_flag_and_every_owner_exists():
    from orchestrator.plan.layout import AXIS

    assert set(FLAG_OWNERS) <= known_flags()

    def spec_key(key: str) -> bool:
        """``key`` (dotted) is a field of the spec file."""
        model: type[BaseModel] | None = SpecFile
        for part in key.split("."):
            if model is None or part not in model.model_fields:
                return False
            ann = model.model_fields[part].annotation
            models = [a for a in (ann, *typing.get_args(ann)) if isinstance(a, type) and issubclass(a, BaseModel)]
            model = models[0] if models else None
        return True

    for owners in [*FLAG_OWNERS.values(), *DS_CONFIG_OWNERS.values()]:
        for o in owners:
            assert o in AXIS or spec_key(o), o


# Flags of the layout sections that are the spec's engine options, not the layout's: an override may
# replace them.
ENGINE_OPTIONS = {
    "--cp-comm-type",
    "--transformer-impl",
    "--tp-comm-overlap",
    "--no-overlap-p2p-communication",
    "--overlap-grad-reduce",
    "--overlap-param-gather",
    "--grad-reduce-in-bf16",
    "--ckpt-format",
}


@pytest.mark.parametrize(
    "spec, pins",
    [
        ("llama3-70b.yaml", ["--tp", "8", "--pp", "4", "--vpp", "2", "--recompute", "full", "--recompute-layers", "2"]),
        ("llama3-70b-128k.yaml", ["--cp", "4", "--sp"]),
        ("mixtral-8x7b.yaml", ["--ep", "8", "--zero", "2"]),
        ("deepseek-v3.yaml", []),
    ],
)
def test_every_flag_the_layout_renders_is_refused(spec, pins, runner, in_tmp):
    """What render/megatron.py emits from the layout (its parallelism, data-parallel and batch
    sections) is in FLAG_OWNERS, or one of the spec's engine options."""
    from orchestrator.render import megatron

    r = run(
        runner,
        "plan",
        f"examples/{spec}",
        "--cluster",
        "dgx16",
        "--runtime",
        "megatron",
        "--nodes",
        "32",
        *pins,
        "--out",
        in_tmp / "p",
    )
    assert r.exit_code == 0, r.output
    pd = load_plan_dir(in_tmp / "p")
    from orchestrator.compose import replan

    the_plan, _ = replan(in_tmp / "p", None)
    assert the_plan.layout == pd.layout
    sections = (megatron._parallelism_flags, megatron._data_parallel_flags, megatron._batch_and_recompute_flags)
    emitted = {flag for section in sections for flag, _ in section(the_plan)}
    assert emitted - ENGINE_OPTIONS <= set(FLAG_OWNERS), emitted - ENGINE_OPTIONS - set(FLAG_OWNERS)


# ---- dsorch diff -------------------------------------------------------------------------------


def test_diff_shows_two_plans_that_differ_only_by_an_override(runner, in_tmp):
    a = spec_with(in_tmp, None, "a.yaml")
    b = spec_with(
        in_tmp, {"megatron_args": ["--log-interval 5", "--seed 7"], "ds_config": {"steps_per_print": 3}}, "b.yaml"
    )
    for spec, out in ((a, "pa"), (b, "pb")):
        assert run(runner, "plan", spec, "--cluster", "local", "--out", in_tmp / out).exit_code == 0
    r = run(runner, "diff", in_tmp / "pa", in_tmp / "pb")
    assert r.exit_code == 0, r.output
    assert "model spec fields:\n  overrides.megatron_args: nothing -> --log-interval 5, --seed 7\n" in r.output
    assert "  overrides.ds_config.steps_per_print: (absent) -> 3\n" in r.output
    assert "  + --log-interval 5 (spec override)\n" in r.output
    assert "  --seed: 1234 -> 7 (spec override)\n" in r.output
    assert "ds_config.json:\n  steps_per_print: 10 -> 3 (spec override)\n" in r.output
    j = json.loads(run(runner, "diff", in_tmp / "pa", in_tmp / "pb", "--json").output)
    assert {"flag": "--seed", "before": "1234", "after": "7"} in j["megatron_flags"]
    assert {"key": "steps_per_print", "before": 10, "after": 3} in j["ds_config"]
