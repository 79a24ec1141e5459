#!/usr/bin/env python3
"""Build the model a `megatron_args.txt` describes with Megatron-LM's own code, on CPU, and count its parameters.

    python scripts/megatron_param_count.py --megatron-lm PATH FLAGS_FILE

Prints one JSON line: {"params": N, "mtp_params": M, "expert_bias": B} (the whole model on one rank, its
multi-token-prediction modules among them; B is the routers' expert-bias buffers, which Megatron keeps beside the
parameters and dsorch counts with them). tests/system/test_megatron_lm.py compares this with dsorch's own count
(ModelSpec.num_params + mtp_params) on small models that carry every architecture feature the flags express.

It runs what pretrain_gpt.py runs to build the model (parse_args, validate_args, gpt_builders.gpt_builder) in a
one-rank gloo group, with what a CPU needs and the parameter count does not see changed: every parallel degree 1
(the count is the whole model), Megatron's local layers instead of Transformer Engine's (--transformer-impl
local; no fused kernels), the allgather token dispatcher (the dispatchers hold no weights; alltoall asks for CUDA
streams) and a sequential MLP per expert instead of the grouped GEMM (the same weights). Where Megatron's local
code asks CUDA for a device or lacks a path of TE's it is answered here, never patched in its files: the CPU as
the current device, MLA's core attention given its head widths (it holds no weights), and the inference-layer
check of the MTP projection (an isinstance() on classes that exist only with TE). Same interpreter requirements as
scripts/check_megatron_lm.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

# Flags (with their values) that set parallel degrees, pipeline splits or GPU kernels: replaced below.
_DROP = {
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size", "--cp-comm-type",
    "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--num-layers-per-virtual-pipeline-stage",
    "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split", "--sequence-parallel",
    "--transformer-impl", "--tp-comm-overlap", "--moe-grouped-gemm", "--moe-token-dispatcher-type",
    "--moe-flex-dispatcher-backend", "--overlap-moe-expert-parallel-comm", "--use-megatron-fsdp",
    "--data-parallel-sharding-strategy", "--ckpt-format", "--fp8-format", "--fp8-amax-history-len",
    "--fp8-amax-compute-algo", "--global-batch-size", "--no-overlap-p2p-communication",
}
_CPU = ["--transformer-impl", "local", "--use-cpu-initialization", "--no-rope-fusion", "--no-persist-layer-norm",
        "--no-gradient-accumulation-fusion", "--moe-token-dispatcher-type", "allgather", "--global-batch-size", "1"]


def cpu_argv(text: str) -> list[str]:
    """megatron_args.txt's words (as bash's $(cat ...) splits them), less _DROP, plus _CPU."""
    argv: list[str] = []
    for line in text.splitlines():
        words = line.split()
        if words and words[0] not in _DROP:
            argv += words
    return argv + _CPU


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--megatron-lm", default=os.environ.get("MEGATRON_LM"), required=not os.environ.get("MEGATRON_LM"))
    ap.add_argument("flags_file", type=Path)
    a = ap.parse_args()
    os.environ.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", CUDA_DEVICE_MAX_CONNECTIONS="1")
    os.environ.setdefault("MASTER_PORT", "29531")
    import typing

    if not hasattr(typing, "override"):  # Python < 3.12 (see scripts/check_megatron_lm.py)
        import typing_extensions

        typing.override = typing_extensions.override
    sys.path.insert(0, str(Path(a.megatron_lm).resolve()))
    warnings.simplefilter("ignore")
    import torch

    if not torch.cuda.is_available():
        torch.cuda.current_device = lambda: "cpu"  # where Megatron's layers allocate
    import megatron.core.transformer.multi_token_prediction as mtp_module
    from megatron.core import parallel_state
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.training.arguments import parse_args, validate_args
    from megatron.training.global_vars import set_global_variables

    init = DotProductAttention.__init__

    def init_any_width(self, *args, k_channels=None, v_channels=None, **kwargs):
        init(self, *args, **kwargs)

    DotProductAttention.__init__ = init_any_width
    mtp_module.is_inference_column_parallel_linear = lambda module: False
    sys.argv = ["pretrain_gpt.py", *cpu_argv(a.flags_file.read_text())]
    args = parse_args()
    validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
    set_global_variables(args, build_tokenizer=False)
    args.padded_vocab_size = args.vocab_size  # dsorch's --make-vocab-size-divisible-by pads nothing (tp 1)
    torch.distributed.init_process_group("gloo", world_size=1, rank=0)
    parallel_state.initialize_model_parallel()
    from gpt_builders import gpt_builder

    model = gpt_builder(args, True, True)
    params = dict(model.named_parameters())
    print(json.dumps({
        "params": sum(p.numel() for p in params.values()),
        "mtp_params": sum(p.numel() for n, p in params.items() if n.startswith("mtp.")),
        "expert_bias": sum(b.numel() for n, b in model.named_buffers() if n.endswith("expert_bias")),
    }))
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
