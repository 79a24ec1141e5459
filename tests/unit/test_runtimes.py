"""The runtime objects (orchestrator.runtimes): every runtime answers every fact the rest of dsorch
asks, the names parse to the objects and back, and an unknown name is refused with the choices."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from orchestrator.errors import SpecError
from orchestrator.runtimes import (
    DEEPSPEED,
    DEFAULT,
    DS_CONFIG,
    MEGATRON,
    MEGATRON_ARGS,
    RUNTIME_NAMES,
    RUNTIMES,
    Engine,
    Runtime,
    runtime_named,
)
from orchestrator.spec.model import ModelSpec, MoESpec
from orchestrator.spec.training import TrainingSpec

ALL = list(RUNTIMES.values())
MODEL = ModelSpec(num_layers=4, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=4, vocab_size=1000)
TRAINING = TrainingSpec(seq_length=512, global_batch_size=8)


def test_names_parse_to_the_objects_and_back():
    assert RUNTIME_NAMES == ("deepspeed", "megatron")
    assert DEFAULT is DEEPSPEED
    for name in RUNTIME_NAMES:
        rt = runtime_named(name)
        assert rt.name == name and str(rt) == name and f"{rt}" == name
        assert runtime_named(rt) is rt  # an object passes through


def test_unknown_name_is_refused_with_the_choices():
    with pytest.raises(SpecError, match=r"unknown runtime 'torchtitan': use one of deepspeed, megatron"):
        runtime_named("torchtitan")


@pytest.mark.parametrize("rt", ALL, ids=str)
def test_every_runtime_answers_every_fact(rt: Runtime):
    # Every field is set (none left to a default a new runtime could forget).
    for f in dataclasses.fields(Runtime):
        assert hasattr(rt, f.name), f.name
    assert isinstance(rt.engine, Engine) and isinstance(rt.engine_for(TRAINING), Engine)
    assert rt.label and rt.stop_handler and rt.calibration_engines
    assert rt.reads in rt.renders and set(rt.renders) >= {"job.sbatch", "launch.sh", MEGATRON_ARGS}
    assert list(rt.renders) == sorted(rt.renders)
    assert rt.reads_megatron_args == (rt.reads == MEGATRON_ARGS)
    for precision in ("bf16", "fp16", "fp32"):
        w, g, o = rt.state_bytes(precision, np.array([0, 1]))
        assert np.all(np.asarray(w) > 0) and np.all(np.asarray(g) > 0) and np.all(np.asarray(o) > 0)
        assert rt.step_transient_bytes(precision) >= 0
    engines = rt.calibration_engine(np.array([0, 1, 3]), np.array([1, 2, 1]))
    assert set(engines.tolist()) <= set(rt.calibration_engines)
    for pp in (1, 4):
        stages = rt.zero_stages(pp, "bf16", 8)
        assert stages and all(0 <= z <= 3 for z in stages)
        for z in {0, 1, 2, 3} - set(rt.zero_stages(pp, "bf16", 8, pinned=2)):
            assert f"zero_stage={z}" in rt.zero_refusal(z, pp, 8, False)
    assert rt.expert_mesh(2, 1, 4) in (4, 8)
    assert isinstance(rt.expert_zero_ok(2, 1), bool)
    assert rt.model_problems(MODEL) == []
    # What the cost model asks (costmodel/): the data-parallel buckets, the whole-buffer all-reduce, checkpoints.
    assert np.all(np.asarray(rt.dp_bucket_elements(np.array([2, 64]))) > 0)
    assert rt.whole_grad_allreduce("bf16", np.array([0, 1])).shape == (2,)
    assert rt.saves_fp32_master("bf16", 1) and isinstance(rt.saves_fp32_master("fp32", 1), bool)
    for flag in ("grads_reduced_in_weight_dtype", "in_place_cross_entropy", "keeps_pipe_outputs", "blocking_pipeline"):
        assert isinstance(getattr(rt, flag), bool)
    for flag in ("bundled_trainer", "launch_per_node", "interleaved_schedule", "context_parallel", "fp8"):
        assert isinstance(getattr(rt, flag), bool)


def test_the_two_runtimes_differ_where_dsorch_says():
    # The bundled entrypoint: DeepSpeed's ds_config.json, one task per GPU, no interleaving, CP or FP8.
    assert DEEPSPEED.bundled_trainer and DEEPSPEED.reads == DS_CONFIG and DS_CONFIG in DEEPSPEED.renders
    assert not DEEPSPEED.launch_per_node and DEEPSPEED.fsdp_zero_stage is None
    assert not (DEEPSPEED.interleaved_schedule or DEEPSPEED.context_parallel or DEEPSPEED.fp8)
    assert DEEPSPEED.expert_mesh(2, 1, 4) == 4 and not DEEPSPEED.expert_zero_ok(2, 3)
    # Megatron-LM: its own program from megatron_args.txt, torchrun per node, Megatron-FSDP at ZeRO-2.
    assert not MEGATRON.bundled_trainer and MEGATRON.reads_megatron_args and DS_CONFIG not in MEGATRON.renders
    assert MEGATRON.launch_per_node and MEGATRON.uses_fsdp(2) and not MEGATRON.uses_fsdp(1)
    assert MEGATRON.interleaved_schedule and MEGATRON.context_parallel and MEGATRON.fp8
    assert MEGATRON.expert_mesh(2, 1, 4) == 8 and MEGATRON.expert_zero_ok(2, 3)
    # Megatron-FSDP only when pinned; DeepSpeed's pipeline engine refuses ZeRO-2/3.
    assert MEGATRON.zero_stages(4, "bf16", 8) == [0, 1] and MEGATRON.zero_stages(4, "bf16", 8, pinned=2) == [0, 1, 2]
    assert DEEPSPEED.zero_stages(4, "fp32", 8) == [0, 1]
    assert "pipeline engine" in DEEPSPEED.zero_refusal(2, 4, 8, False)


def test_megatron_refuses_what_it_cannot_build():
    geglu = MODEL.model_copy(update={"activation": "geglu"})
    assert any("geglu" in p for p in MEGATRON.model_problems(geglu)) and DEEPSPEED.model_problems(geglu) == []
    moe = MODEL.model_copy(
        update={"moe": MoESpec(num_experts=4, top_k=1, ffn_hidden_size=128, router="softmax", norm_top_k=True)}
    )
    assert any("norm_top_k" in p for p in MEGATRON.model_problems(moe))
