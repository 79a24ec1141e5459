"""The entrypoint's launch edge (orchestrator/train/loop/launch.py) against the environment CUDA images set."""

from __future__ import annotations

import pytest

from orchestrator.train.loop.launch import deepspeed_arch_list


@pytest.mark.parametrize("given, expected", [
    ("9.0a", "9.0"),
    ("8.0 9.0a 10.0f+PTX", "8.0;9.0;10.0+PTX"),
    ("7.5;8.0;8.6;9.0;10.0;12.0+PTX", "7.5;8.0;8.6;9.0;10.0;12.0+PTX"),
])
def test_arch_suffixes_are_dropped_for_deepspeeds_op_builder(monkeypatch, given, expected):
    """DeepSpeed's own JIT builder (FusedAdam, the optimizer of every CUDA run) fails on the
    architecture-specific entry and reads the rewritten list."""
    pytest.importorskip("deepspeed")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder

    assert deepspeed_arch_list(given) == expected
    builder = FusedAdamBuilder()
    builder.jit_mode = True
    if given != expected:
        monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", given)
        with pytest.raises(ValueError, match="invalid literal for int"):
            builder.compute_capability_args()
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", expected)
    builder.compute_capability_args()
