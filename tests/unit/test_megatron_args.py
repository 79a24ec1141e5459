"""Megatron-LM flag validation against the checked-in argument table (offline)."""
from __future__ import annotations

import json
from importlib import resources

import pytest

from orchestrator.validate.megatron import check_megatron_args, known_flags, load_table, parse_args_lines

# What a Llama-3-70B layout planned by dsorch looks like in megatron_args.txt.
LLAMA3_70B = """\
# Llama-3-70B, 256 GPUs: tp 8 x pp 4 x dp 8
--tensor-model-parallel-size 8
--pipeline-model-parallel-size 4
--num-layers-per-virtual-pipeline-stage 5
--sequence-parallel
--use-distributed-optimizer

--num-layers 80
--hidden-size 8192
--ffn-hidden-size 28672
--num-attention-heads 64
--group-query-attention
--num-query-groups 8
--seq-length 8192
--max-position-embeddings 8192
--vocab-size 128256
--swiglu
--normalization RMSNorm
--position-embedding-type rope
--untie-embeddings-and-output-weights
--disable-bias-linear
--use-flash-attn
--micro-batch-size 1
--global-batch-size 1024
--bf16
--recompute-granularity selective
--train-iters 100000
--lr 1.5e-4
--min-lr 1.5e-5
--lr-decay-style cosine
--lr-warmup-iters 2000
--weight-decay 0.1
--clip-grad 1.0
--adam-beta1 0.9
--adam-beta2 0.95
--init-method-std 0.008
--attention-dropout 0.0
--hidden-dropout 0.0
--seed 1234
"""

EMITTED_FLAGS = """
--tensor-model-parallel-size --pipeline-model-parallel-size
--num-layers-per-virtual-pipeline-stage --sequence-parallel --num-layers --hidden-size
--ffn-hidden-size --num-attention-heads --group-query-attention --num-query-groups
--seq-length --max-position-embeddings --micro-batch-size --global-batch-size --bf16 --fp16
--recompute-granularity --recompute-method --recompute-num-layers --use-distributed-optimizer
--swiglu --normalization --position-embedding-type --untie-embeddings-and-output-weights
--vocab-size --use-flash-attn --disable-bias-linear --train-iters --lr --min-lr
--lr-decay-style --lr-warmup-iters --weight-decay --clip-grad --adam-beta1 --adam-beta2
--init-method-std --attention-dropout --hidden-dropout --seed
""".split()


def _with(text: str = LLAMA3_70B, drop: tuple[str, ...] = (), **changes: str | None):
    """The Llama flags with some dropped, changed (key=value) or added (value None = switch)."""
    flags = [(f, v) for f, v in parse_args_lines(text) if f not in drop]
    for key, value in changes.items():
        flag = "--" + key.replace("_", "-")
        flags = [(f, v) for f, v in flags if f != flag] + [(flag, value)]
    return flags


def _check(world_size: int = 256, **kw):
    return check_megatron_args(_with(**kw), world_size)


def _one_error(errors: list[str], *needles: str) -> None:
    matching = [e for e in errors if all(n in e for n in needles)]
    assert matching, f"no error containing {needles}: {errors}"


# --------------------------------------------------------------------------- table


def test_table_header_and_size():
    table = load_table()
    assert table["num_arguments"] == len(table["arguments"]) > 300
    assert table["source_path"] == "megatron/training/arguments.py"
    assert len(table["wheel_sha256"]) == 64
    assert table["megatron_core_version"]


def test_table_is_a_package_resource():
    text = resources.files("orchestrator.validate").joinpath("megatron_args.json").read_text()
    assert json.loads(text)["num_arguments"] > 300


@pytest.mark.parametrize("flag", EMITTED_FLAGS)
def test_table_contains_flags_dsorch_emits(flag):
    assert flag in known_flags()


def test_table_records_types_actions_and_choices():
    by_opt = {o: r for r in load_table()["arguments"] for o in r["option_strings"]}
    assert by_opt["--num-layers"]["type"] == "int"
    assert by_opt["--lr"]["type"] == "float"
    assert by_opt["--sequence-parallel"]["action"] == "store_true"
    # A default-True dataclass bool becomes a store_false '--disable-...' switch.
    assert by_opt["--disable-bias-linear"]["action"] == "store_false"
    assert by_opt["--disable-bias-linear"]["dest"] == "add_bias_linear"
    assert by_opt["--recompute-granularity"]["choices"] == ["full", "selective"]
    assert set(by_opt["--normalization"]["choices"]) >= {"LayerNorm", "RMSNorm"}


# --------------------------------------------------------------------------- parsing


def test_parse_args_lines_formats():
    text = "# comment\n\n--tensor-model-parallel-size 8\n  --bf16  \n--lr=3e-4\n" \
           "--rampup-batch-size 16 16 1000\n"
    assert parse_args_lines(text) == [
        ("--tensor-model-parallel-size", "8"),
        ("--bf16", None),
        ("--lr", "3e-4"),
        ("--rampup-batch-size", "16 16 1000"),
    ]


# --------------------------------------------------------------------------- valid layout


def test_llama3_70b_layout_is_valid():
    assert check_megatron_args(parse_args_lines(LLAMA3_70B), 256) == []


def test_full_recompute_with_method_and_layers_is_valid():
    flags = _with(recompute_granularity="full", recompute_method="uniform",
                  recompute_num_layers="1")
    assert check_megatron_args(flags, 256) == []


def test_block_recompute_of_some_layers_is_valid_up_to_a_stage():
    flags = _with(recompute_granularity="full", recompute_method="block", recompute_num_layers="3")
    assert check_megatron_args(flags, 256) == []
    per_rank = int(dict(flags)["--num-layers"]) // int(dict(flags)["--pipeline-model-parallel-size"])
    too_many = _with(recompute_granularity="full", recompute_method="block", recompute_num_layers=str(per_rank + 1))
    _one_error(check_megatron_args(too_many, 256), f"exceeds the {per_rank} layers per pipeline rank")


def test_nargs_values_are_checked_per_token():
    assert _check(rampup_batch_size="32 32 1000") == []
    _one_error(_check(rampup_batch_size="32 32"), "--rampup-batch-size", "exactly 3 values")


# --------------------------------------------------------------------------- per-flag errors


def test_unknown_flag_suggests_closest():
    _one_error(_check(tensor_model_parallel_sizes="8"), "unknown flag --tensor-model-parallel-sizes",
               "did you mean --tensor-model-parallel-size?")


def test_abbreviation_is_unknown():
    # Megatron builds its parser with allow_abbrev=False.
    _one_error(_check(tensor_model_parallel="8"), "unknown flag --tensor-model-parallel")


def test_switch_with_value():
    _one_error(_check(sequence_parallel="true"), "--sequence-parallel is a switch",
               "takes no value")


def test_option_without_value():
    _one_error(_check(drop=("--num-layers",), num_layers=None), "--num-layers needs a value")


def test_bad_int_and_float():
    _one_error(_check(num_layers="eighty"), "--num-layers expects an integer", "'eighty'")
    _one_error(_check(lr="fast"), "--lr expects a number", "'fast'")


def test_bad_choice():
    _one_error(_check(recompute_granularity="partial"), "--recompute-granularity 'partial'",
               "full, selective")


def test_duplicate_flag():
    flags = parse_args_lines(LLAMA3_70B) + [("--num-layers", "80")]
    _one_error(check_megatron_args(flags, 256), "--num-layers given more than once")


# --------------------------------------------------------------------------- cross-checks


def test_world_size_not_divisible_by_model_parallel():
    _one_error(_check(world_size=100), "world size 100 is not divisible by",
               "--tensor-model-parallel-size 8", "--pipeline-model-parallel-size 4", "= 32")


@pytest.mark.parametrize("key", ["tensor_model_parallel_size", "pipeline_model_parallel_size",
                                 "context_parallel_size"])
@pytest.mark.parametrize("value", ["0", "-2"])
def test_a_parallel_size_below_one_is_an_error_not_a_crash(key, value):
    _one_error(_check(**{key: value}), "--" + key.replace("_", "-"), value, "must be at least 1")


def test_context_parallel_counts_in_model_size():
    _one_error(_check(context_parallel_size="3"), "--context-parallel-size 3", "= 96")


def test_global_batch_not_divisible_by_micro_times_dp():
    _one_error(_check(global_batch_size="1020"), "--global-batch-size 1020",
               "--micro-batch-size 1 x data-parallel size 8 = 8")


def test_num_layers_not_divisible_by_pp():
    errors = _check(world_size=96, drop=("--num-layers-per-virtual-pipeline-stage",),
                    pipeline_model_parallel_size="3", global_batch_size="1024")
    _one_error(errors, "--num-layers 80 is not divisible by --pipeline-model-parallel-size 3",
               "choose a pipeline size that divides 80")


def test_uneven_pp_is_accepted_and_checked():
    ok = _check(world_size=96, drop=("--num-layers-per-virtual-pipeline-stage",),
                pipeline_model_parallel_size="3", decoder_first_pipeline_num_layers="26",
                decoder_last_pipeline_num_layers="26")
    assert ok == []
    no_vpp = ("--num-layers-per-virtual-pipeline-stage",)
    bad = _check(drop=no_vpp, decoder_first_pipeline_num_layers="20",
                 decoder_last_pipeline_num_layers="21")
    _one_error(bad, "the 39 middle layers are not divisible by the 2 middle pipeline stages")
    bad = _check(drop=no_vpp, pipeline_model_parallel_size="2",
                 decoder_first_pipeline_num_layers="40", decoder_last_pipeline_num_layers="30")
    _one_error(bad, "uneven pipeline split leaves 10 layers for 0 middle stages")


def test_virtual_stage_must_divide_layers_per_stage():
    _one_error(_check(num_layers_per_virtual_pipeline_stage="3"),
               "--num-layers-per-virtual-pipeline-stage 3 does not divide the 20 layers")


def test_interleaved_schedule_needs_pipeline():
    errors = _check(world_size=64, pipeline_model_parallel_size="1",
                    num_layers_per_virtual_pipeline_stage="40", global_batch_size="64")
    _one_error(errors, "--num-layers-per-virtual-pipeline-stage", "> 1", "(got 1)")


def test_interleaved_schedule_without_p2p_overlap_needs_pp_above_2():
    errors = _check(world_size=128, pipeline_model_parallel_size="2",
                    num_layers_per_virtual_pipeline_stage="10",
                    no_overlap_p2p_communication=None)
    _one_error(errors, "> 2", "--no-overlap-p2p-communication")


def test_heads_not_divisible_by_tp():
    errors = _check(num_attention_heads="60", hidden_size="7680", num_query_groups="4")
    _one_error(errors, "--num-attention-heads 60 is not divisible by "
                       "--tensor-model-parallel-size 8", "choose a tensor-parallel size")
    errors = _check(world_size=96, tensor_model_parallel_size="3")
    _one_error(errors, "--num-attention-heads 64 is not divisible by "
                       "--tensor-model-parallel-size 3")


def test_query_groups_vs_tp():
    # 8 groups with tp 8 is fine; 12 groups with tp 8 is neither a multiple nor a divisor.
    _one_error(_check(num_attention_heads="96", hidden_size="12288", num_query_groups="12"),
               "--num-query-groups 12 is neither a multiple nor a divisor of "
               "--tensor-model-parallel-size 8")
    _one_error(_check(num_query_groups="7"), "--num-attention-heads 64 is not divisible by "
                                             "--num-query-groups 7")


def test_query_groups_without_gqa_is_ignored_by_megatron():
    _one_error(_check(drop=("--group-query-attention",)),
               "--num-query-groups has no effect without --group-query-attention")


def test_sequence_parallel_needs_tp():
    errors = _check(world_size=32, tensor_model_parallel_size="1", global_batch_size="1024")
    _one_error(errors, "--sequence-parallel requires --tensor-model-parallel-size > 1")


def test_fp16_and_bf16():
    _one_error(_check(fp16=None), "--fp16 and --bf16 are mutually exclusive")


def test_full_recompute_needs_method_and_layers():
    errors = _check(recompute_granularity="full")
    _one_error(errors, "--recompute-granularity full needs --recompute-method")
    _one_error(errors, "--recompute-granularity full needs --recompute-num-layers")


def test_selective_recompute_rejects_method_and_layers():
    errors = _check(recompute_method="uniform", recompute_num_layers="1")
    _one_error(errors, "--recompute-method is not supported with --recompute-granularity "
                       "selective")
    _one_error(errors, "--recompute-num-layers must not be set with --recompute-granularity "
                       "selective")


def test_recompute_method_without_granularity():
    _one_error(_check(drop=("--recompute-granularity",), recompute_method="block"),
               "--recompute-method has no effect without --recompute-granularity")


def test_seq_length_above_max_positions():
    _one_error(_check(seq_length="16384"), "--max-position-embeddings 8192 is smaller than "
                                           "--seq-length 16384")


def test_missing_required_args():
    errors = _check(drop=("--hidden-size", "--micro-batch-size"))
    _one_error(errors, "--hidden-size is required")
    _one_error(errors, "--micro-batch-size is required")


def test_deprecated_flag():
    _one_error(_check(batch_size="4"), "--batch-size is no longer valid",
               "use --micro-batch-size")


def test_errors_are_strings():
    errors = _check(world_size=7, fp16=None, sequence_parallel="x")
    assert errors and all(isinstance(e, str) for e in errors)


def _megatron_plan_flags(tmp_path, *extra) -> str:
    from click.testing import CliRunner

    from orchestrator.cli.main import main
    from tests.conftest import EXAMPLES

    out = tmp_path / "m"
    r = CliRunner().invoke(main, ["plan", str(EXAMPLES / "llama3-8b.yaml"), "--cluster", "dgx16", "--nodes", "1",
                                  "--runtime", "megatron", "--out", str(out), *extra])
    assert r.exit_code == 0, r.output
    return (out / "megatron_args.txt").read_text()


def test_megatron_plans_carry_what_pretrain_needs(tmp_path):
    """What running Megatron-LM's own code on planned files found missing (scripts/check_megatron_lm.py):
    every megatron-runtime plan names its tokenizer, data, length, evaluation, checkpoints and stop signal."""
    from orchestrator.validate.megatron import check_pretrain_needs

    text = _megatron_plan_flags(tmp_path)
    flags = parse_args_lines(text)
    assert check_pretrain_needs(flags) == []
    given = dict(flags)
    assert given["--tokenizer-type"] == "NullTokenizer" and "--mock-data" in given
    assert given["--save"] == given["--load"] == "checkpoints" and given["--exit-signal"] == "SIGUSR2"
    assert given["--attention-backend"] == "flash" and "--use-flash-attn" not in given
    # Megatron pads the vocabulary to a multiple of divisor x tp; the planned divisor leaves it as planned.
    tp = int(given["--tensor-model-parallel-size"])
    assert int(given["--vocab-size"]) % (int(given["--make-vocab-size-divisible-by"]) * tp) == 0
    for drop, message in [("--tokenizer-type", "no --tokenizer-type"), ("--train-iters", "no --train-iters"),
                          ("--eval-interval", "no --eval-interval"), ("--mock-data", "no data"),
                          ("--save", "without --save")]:
        errors = check_pretrain_needs([(f, v) for f, v in flags if f != drop])
        assert len(errors) == 1 and message in errors[0], (drop, errors)


def test_vocab_divisor_keeps_the_planned_vocabulary():
    from orchestrator.render.megatron import vocab_divisor

    assert vocab_divisor(128256, 8) == 32  # 128256 = 2^8 x 501: 32 x 8 divides it, 64 x 8 does not
    assert vocab_divisor(128256, 1) == 128 and vocab_divisor(32000, 4) == 64 and vocab_divisor(50257, 2) == 1
    for v, tp in [(128256, 8), (32000, 8), (51200, 8), (256, 2), (50257, 4)]:
        d = vocab_divisor(v, tp)
        assert v % (d * tp) == 0 or d == 1


def test_data_path_and_tokenizer_model_reach_the_flags(tmp_path):
    spec = tmp_path / "spec.yaml"
    from tests.conftest import EXAMPLES

    spec.write_text((EXAMPLES / "llama3-8b.yaml").read_text() + (
        "  data:\n    path: ['0.7', /data/web_text_document, '0.3', /data/code_text_document]\n    split: '98,2,0'\n"
        "    tokenizer: {type: HuggingFaceTokenizer, model: /models/llama3}\n"
        "  checkpoint: {dir: /ckpt/llama3-8b, interval: 500}\n"))
    from click.testing import CliRunner

    from orchestrator.cli.main import main

    out = tmp_path / "m"
    r = CliRunner().invoke(main, ["plan", str(spec), "--cluster", "dgx16", "--nodes", "1", "--runtime", "megatron",
                                  "--out", str(out)])
    assert r.exit_code == 0, r.output
    given = dict(parse_args_lines((out / "megatron_args.txt").read_text()))
    assert given["--data-path"] == "0.7 /data/web_text_document 0.3 /data/code_text_document"
    assert given["--split"] == "98,2,0" and "--mock-data" not in given
    assert given["--tokenizer-type"] == "HuggingFaceTokenizer" and given["--tokenizer-model"] == "/models/llama3"
    assert given["--save"] == "/ckpt/llama3-8b" and given["--save-interval"] == "500"
    assert "export DSORCH_RUN_DIR=/ckpt/llama3-8b\n" in (out / "job.sbatch").read_text()


@pytest.mark.parametrize("yaml_text, message", [
    ("  data: {tokenizer: {type: HuggingFaceTokenizer}}\n", "set tokenizer.model"),
    ("  data: {path: ['/data/with space']}\n", "has whitespace"),
    ("  data: {split: '90;10'}\n", "training.data.split"),
    ("  steps: 100\n", "both give the training length"),
])
def test_bad_data_settings_are_refused(tmp_path, yaml_text, message):
    from click.testing import CliRunner

    from orchestrator.cli.main import main
    from tests.conftest import EXAMPLES

    spec = tmp_path / "spec.yaml"
    spec.write_text((EXAMPLES / "llama3-8b.yaml").read_text() + yaml_text)
    r = CliRunner().invoke(main, ["plan", str(spec), "--cluster", "dgx16", "--no-write"])
    assert r.exit_code == 2 and message in " ".join(r.output.split()) and "Traceback" not in r.output, r.output


def test_megatron_runtime_needs_a_training_length(tmp_path):
    from click.testing import CliRunner

    from orchestrator.cli.main import main
    from tests.conftest import EXAMPLES

    spec = tmp_path / "spec.yaml"
    spec.write_text((EXAMPLES / "llama3-8b.yaml").read_text().replace("  train_tokens: 15.0e12", "  # no length"))
    r = CliRunner().invoke(main, ["plan", str(spec), "--cluster", "dgx16", "--nodes", "1", "--runtime", "megatron",
                                  "--no-write"])
    assert r.exit_code == 2 and "needs the training length" in r.output and "training.steps" in r.output
    r = CliRunner().invoke(main, ["plan", str(spec), "--cluster", "dgx16", "--nodes", "1", "--no-write"])
    assert r.exit_code == 0, r.output
