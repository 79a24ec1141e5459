#!/usr/bin/env python3
"""Run Megatron-LM's own argument, tokenizer and pre-data checks on planned `megatron_args.txt` files.

    python scripts/check_megatron_lm.py --megatron-lm PATH PLAN_DIR [PLAN_DIR...]

PATH is a Megatron-LM source tree (a checkout of github.com/NVIDIA/Megatron-LM; default $MEGATRON_LM).
Each PLAN_DIR holds `megatron_args.txt` and `plan.yaml` as `dsorch plan` writes them. Every plan is
checked in a fresh subprocess of this interpreter, because Megatron keeps its args, tokenizer and
microbatch calculator in module globals (megatron/training/global_vars.py) that refuse to be set twice.

It replays what `pretrain_gpt.py` does before it needs GPUs, calling Megatron's real functions:

  gpu-shims       answer the CUDA/Transformer Engine questions the cluster would (see do_gpu_shims; --no-gpu-shims)
  parse           megatron.training.arguments.parse_args() on sys.argv = ['pretrain_gpt.py'] + the flags
                  (split on whitespace, as bash's `$(cat megatron_args.txt)` in launch.sh does)
  validate        validate_args(args, {'tokenizer_type': 'GPT2BPETokenizer'}), the defaults pretrain_gpt.py
                  passes to parse_and_validate_args(); env WORLD_SIZE = tp*pp*dp*cp from plan.yaml, RANK=0,
                  CUDA_DEVICE_MAX_CONNECTIONS=1 (launch.sh exports it; validate_args asserts it under TP)
  globals         set_global_variables(args, build_tokenizer=False): the microbatch calculator, timers,
                  writers, and the --exit-signal-handler's DistributedSignalHandler
  tokenizer       global_vars._build_tokenizer(args) -> megatron.core.tokenizers.utils.build_tokenizer,
                  which also sets args.padded_vocab_size (vocab_size_with_padding)
  model-config    argument_utils.gpt_config_from_args(args) -> core_transformer_config_from_args(args)
                  -> TransformerConfig.__post_init__ (pretrain_gpt.py's __main__ does this before pretrain())
  config-container argument_utils.pretrain_cfg_container_from_args(args, model_cfg) (ditto)
  train-iters     training.get_optimizer_param_scheduler() on a one-parameter torch optimizer: where
                  pretrain() raises 'either train-iters or train-samples should be provided.' and
                  OptimizerParamScheduler asserts warmup < decay steps
  train-samples   training.get_train_valid_test_num_samples(), which sizes the datasets (needs --eval-interval)
                  (train-samples and data-config run for --runtime megatron plans only: a deepspeed plan is run by
                  dsorch's entrypoint, which takes its data from its own command line)
  data-config     pretrain_gpt.core_gpt_dataset_config_from_args() (GPTDatasetConfig.__post_init__), and with
                  no data flags at all the GPTDataset build that then fails. Dataset files are never opened:
                  their paths are the cluster's.

Not covered: torch.distributed / CUDA initialisation (initialize_megatron), building the model, loading a
checkpoint and reading data files.

The interpreter running this must import Megatron-LM. Tested with Megatron-LM main at
d98e8a64ddf34856e74b24714e3bedb2f5a39553 in a plain Python 3.11 venv holding: torch 2.13.0 (the CPU build
is enough), triton, numpy, packaging, einops, typing_extensions, pyyaml. On Python < 3.12, Megatron's
`from typing import override` needs the shim below (typing.override = typing_extensions.override); we never
patch Megatron's files. Checking plans that use SentencePiece/HuggingFace/TikToken tokenizers needs those
libraries and the tokenizer files too; NullTokenizer needs nothing.

Prints one line per plan, `PASS  DIR` or `FAIL  DIR  [step] error; [step] error`, and exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import traceback
import warnings
from pathlib import Path



# --------------------------------------------------------------------------- parent side

def world_size_of(plan_dir: Path) -> int:
    """tp*pp*dp*cp from plan.yaml's layout block (cp absent means 1)."""
    text = (plan_dir / "plan.yaml").read_text()
    try:
        import yaml
        layout = yaml.safe_load(text)["layout"]
    except ImportError:  # the Megatron venv may lack pyyaml: read the flat `layout:` block by hand
        m = re.search(r"^layout:\n((?:[ \t]+.*\n?)*)", text, re.M)
        layout = dict(re.findall(r"^[ \t]+(\w+):[ \t]*(\S+)", m.group(1), re.M)) if m else {}
    return int(layout["tp"]) * int(layout["pp"]) * int(layout["dp"]) * int(layout.get("cp", 1) or 1)


def runtime_of(plan_dir: Path) -> str:
    """plan.yaml's top-level `runtime:` (deepspeed | megatron)."""
    m = re.search(r"^runtime:\s*(\S+)", (plan_dir / "plan.yaml").read_text(), re.M)
    return m.group(1) if m else "megatron"


def device_arch_of(plan_dir: Path) -> int:
    """CUDA major compute capability of plan.yaml's cluster GPU: A100 8, H100/H200 9, B200/GB200 10."""
    m = re.search(r"^\s*gpu:\s*['\"]?G?([ABH])\d", (plan_dir / "plan.yaml").read_text(), re.M)
    return {"A": 8, "H": 9, "B": 10}[m.group(1)] if m else 9


def check_plan(plan_dir: Path, megatron_lm: Path, world_size: int | None = None, device_arch: int | None = None,
               no_gpu_shims: bool = False, timeout: float = 600, extra_args: str = "") -> dict:
    """Check one plan dir in a child interpreter; returns {'steps': {step: None | error}, 'log': ...}."""
    env = dict(os.environ)
    # validate_args reads the world size and rank from these (torchrun would set them).
    env["WORLD_SIZE"] = str(world_size if world_size is not None else world_size_of(plan_dir))
    env["RANK"] = "0"
    env["LOCAL_RANK"] = "0"
    # As launch.sh leaves it: exported as 1 by profiles for TP overlap (validate_args asserts it under
    # TP), unset by plans on Megatron-FSDP (which asserts it is not 1).
    launch = plan_dir / "launch.sh"
    if launch.is_file() and "unset CUDA_DEVICE_MAX_CONNECTIONS" in launch.read_text():
        env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    else:
        env.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--_child", str(result),
             "--megatron-lm", str(megatron_lm), "--device-arch", str(device_arch or device_arch_of(plan_dir)),
             *(["--no-gpu-shims"] if no_gpu_shims else []), "--extra-args", extra_args, str(plan_dir.resolve())],
            env=env, cwd=tmp, capture_output=True, text=True, timeout=timeout)
        log = proc.stdout + proc.stderr
        if not result.exists():
            tail = "\n".join(log.strip().splitlines()[-5:])
            return {"steps": {"child": f"exited {proc.returncode} without a result: {tail}"}, "log": log}
        doc = json.loads(result.read_text())
    doc["log"] = log
    return doc


def summary(doc: dict) -> str | None:
    failed = [f"[{k}] {v}" for k, v in doc["steps"].items() if v is not None]
    return "; ".join(failed) if failed else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--megatron-lm", default=os.environ.get("MEGATRON_LM"),
                    help="Megatron-LM source tree (default $MEGATRON_LM)")
    ap.add_argument("--world-size", type=int, help="override the world size read from plan.yaml")
    ap.add_argument("--device-arch", type=int,
                    help="CUDA major compute capability to answer for (default: from plan.yaml's GPU, A=8 H=9 B=10)")
    ap.add_argument("--no-gpu-shims", action="store_true",
                    help="do not stand in for CUDA/Transformer Engine (see do_gpu_shims)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every step and Megatron's warnings")
    ap.add_argument("--extra-args", default="",
                    help="flags appended after megatron_args.txt's, as launch.sh passes its own arguments on "
                         "(`dsorch submit` adds --save, --load, --train-iters, ...); with -v their parsed values "
                         "are printed as args.DEST = VALUE")
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    ap.add_argument("plan_dirs", nargs="+", type=Path)
    a = ap.parse_args(argv)
    if not a.megatron_lm:
        ap.error("no Megatron-LM tree: pass --megatron-lm or set MEGATRON_LM")
    megatron_lm = Path(a.megatron_lm).resolve()
    if not (megatron_lm / "megatron" / "training" / "arguments.py").is_file():
        ap.error(f"{megatron_lm} is not a Megatron-LM tree (no megatron/training/arguments.py)")
    if a._child:
        return child(a.plan_dirs[0], megatron_lm, Path(a._child), a.device_arch or 9, not a.no_gpu_shims,
                     a.extra_args.split())

    any_failed = False
    for plan_dir in a.plan_dirs:
        doc = check_plan(plan_dir, megatron_lm, a.world_size, a.device_arch, a.no_gpu_shims,
                         extra_args=a.extra_args)
        err = summary(doc)
        any_failed |= err is not None
        print(f"PASS  {plan_dir}" if err is None else f"FAIL  {plan_dir}  {err}", flush=True)
        if a.verbose:
            for step, e in doc["steps"].items():
                print(f"    {step:17s} {'ok' if e is None else 'FAILED: ' + e}")
            for k, v in doc.get("facts", {}).items():
                print(f"    {k} = {v}")
            for w in doc.get("warnings", []):
                print(f"    warning: {w}")
    return 1 if any_failed else 0


# --------------------------------------------------------------------------- child side

def _short(exc: BaseException) -> str:
    msg = " ".join(str(exc).split()) or "(no message)"
    # Name the Megatron frame that raised, so an AssertionError without text is still traceable.
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "megatron" in f.filename.replace("\\", "/")]
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(exc).__name__}: {msg}{where}"


def child(plan_dir: Path, megatron_lm: Path, result_path: Path, device_arch: int, gpu_shims: bool,
          extra: list[str] = ()) -> int:
    steps: dict[str, str | None] = {}
    caught: list[str] = []
    state: dict = {}

    facts: dict = {}

    def save() -> None:
        result_path.write_text(json.dumps({"steps": steps, "warnings": caught, "facts": facts}, default=str))

    def run(name: str, fn) -> bool:
        ws: list = []
        try:
            with warnings.catch_warnings(record=True) as ws:
                warnings.simplefilter("always")
                fn()
            steps[name] = None
        except SystemExit as e:  # argparse reports a bad flag on stderr and exits 2
            steps[name] = state.pop("argparse_error", None) or f"SystemExit({e.code})"
        except BaseException as e:  # noqa: BLE001 - everything Megatron raises is a finding
            steps[name] = _short(e)
        # Megatron's warn_rank_0() (e.g. the legacy --split default) is worth showing with -v.
        caught.extend(f"[{name}] " + " ".join(str(w.message).split()) for w in ws
                      if "megatron" in str(w.filename).replace("\\", "/"))
        save()
        return steps[name] is None

    flags = (plan_dir / "megatron_args.txt").read_text().split()  # what bash's $(cat file) would pass
    flags += extra  # launch.sh's own arguments come after the file's: argparse keeps a flag's last value

    def do_import():
        import typing
        if not hasattr(typing, "override"):  # Python < 3.12: Megatron does `from typing import override`
            import typing_extensions
            typing.override = typing_extensions.override
        sys.path.insert(0, str(megatron_lm))  # pretrain_gpt.py, gpt_builders.py, model_provider.py live at the top
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed" and the like
            import megatron.training.arguments  # noqa: F401
            import megatron.training.training  # noqa: F401

    def do_gpu_shims():
        # On the cluster, CUDA and Transformer Engine answer these; here we answer for the plan's GPU and
        # assume a recent TE (Megatron's default --transformer-impl transformer_engine needs TE anyway).
        import megatron.core.models.common.embeddings.rope_utils as rope_utils
        import megatron.core.transformer.transformer_config as transformer_config
        import megatron.training.arguments as arguments
        from megatron.core.utils import get_te_version
        # validate_args -> utils.get_device_arch_version() asserts torch.cuda; its answer picks the
        # CUDA_DEVICE_MAX_CONNECTIONS and FSDP/GTP stream-priority branches (Blackwell = 10).
        arguments.get_device_arch_version = lambda: device_arch
        # validate_args asserts the GPU's compute capability for --moe-grouped-gemm ("Unsupported compute
        # capability for GroupedGEMM kernels"): answer for the plan's GPU.
        import torch
        if not torch.cuda.is_available():
            torch.cuda.get_device_capability = lambda *_a, **_k: (device_arch, 0)
        try:
            have_te = get_te_version() is not None and str(get_te_version()) not in ("0", "0.0.0")
        except Exception:  # noqa: BLE001 - get_te_version raises or returns 0.0.0 without TE
            have_te = False
        if not have_te:
            # TransformerConfig.__post_init__ refuses apply_rope_fusion (on by default; --no-rope-fusion)
            # when rope_utils.fused_apply_rotary_pos_emb is None, i.e. TE is missing, and gates other
            # options on is_te_min_version(); neither says anything about the plan.
            def _te_only(*_a, **_k):
                raise RuntimeError("Transformer Engine stand-in: not callable in this check")
            if rope_utils.fused_apply_rotary_pos_emb is None:
                rope_utils.fused_apply_rotary_pos_emb = _te_only
            for mod in (arguments, transformer_config):
                mod.is_te_min_version = lambda *_a, **_k: True

    def do_parse():
        from megatron.training.arguments import parse_args
        sys.argv = ["pretrain_gpt.py", *flags]
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                state["args"] = parse_args()
        except SystemExit:
            lines = [ln for ln in err.getvalue().splitlines() if "error:" in ln]
            state["argparse_error"] = "argparse: " + (lines[-1].split("error:", 1)[1].strip() if lines else
                                                       err.getvalue().strip())
            raise
        args = state["args"]
        # parse_and_validate_args() would load args from a checkpoint or a YAML file here; a plan has neither.
        if args.use_checkpoint_args or args.yaml_cfg is not None:
            raise RuntimeError("--use-checkpoint-args / --yaml-cfg read files this check cannot see")
        for flag in (f for f in extra if f.startswith("--")):  # what the appended flags resolved to
            dest = flag[2:].replace("-", "_")
            facts[f"args.{dest}"] = getattr(args, dest, "(no such argument)")

    def do_validate():
        from megatron.training.arguments import validate_args
        args = state["args"]
        validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})  # pretrain_gpt.py's args_defaults
        facts.update(world_size=args.world_size, data_parallel_size=args.data_parallel_size,
                     tokenizer_type=args.tokenizer_type, attention_backend=args.attention_backend)

    def do_globals():
        from megatron.training.global_vars import set_global_variables
        # build_tokenizer=False so a tokenizer failure is reported by its own step below.
        set_global_variables(state["args"], build_tokenizer=False)

    def do_tokenizer():
        from megatron.training import global_vars
        tok = state["tokenizer"] = global_vars._build_tokenizer(state["args"])
        facts.update(tokenizer=type(tok).__name__, tokenizer_vocab_size=tok.vocab_size,
                     padded_vocab_size=state["args"].padded_vocab_size, eod=getattr(tok, "eod", None))

    def do_model_config():
        from megatron.training.argument_utils import gpt_config_from_args
        state["model_cfg"] = gpt_config_from_args(state["args"])

    def do_config_container():
        from megatron.training.argument_utils import pretrain_cfg_container_from_args
        pretrain_cfg_container_from_args(state["args"], state.get("model_cfg"))

    def do_train_iters():
        import torch
        from megatron.training.training import get_optimizer_param_scheduler
        # The scheduler only writes lr/weight_decay into param_groups, so any torch optimizer will do.
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
        get_optimizer_param_scheduler(opt)

    def do_train_samples():
        from megatron.training.training import get_train_valid_test_num_samples
        # build_train_valid_test_data_loaders() sizes the datasets from train/eval iters and --eval-interval.
        state["num_samples"] = get_train_valid_test_num_samples()
        facts.update(train_iters=state["args"].train_iters, train_valid_test_samples=state["num_samples"])

    def do_data_config():
        import importlib
        pretrain_gpt = importlib.import_module("pretrain_gpt")  # its __main__ block does not run on import
        # What train_valid_test_datasets_provider() builds first: blend/split/--mock-data checks in
        # GPTDatasetConfig.__post_init__ (megatron/core/datasets/blended_megatron_dataset_config.py).
        state["data_cfg"] = cfg = pretrain_gpt.core_gpt_dataset_config_from_args(state["args"])
        args = state["args"]
        if cfg.mock and not (args.mock_data or args.sft):
            # No data flags: GPTDatasetConfig.__post_init__ quietly sets mock=True, but the provider still picks
            # GPTDataset (MockGPTDataset only with --mock-data). Building that reads no files, so let Megatron's
            # BlendedMegatronDatasetBuilder.build() fail for real (tiny sizes; the error does not depend on them).
            from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
            from megatron.core.datasets.gpt_dataset import GPTDataset
            try:
                BlendedMegatronDatasetBuilder(GPTDataset, [1, 1, 1], lambda: True, cfg).build()
            except Exception as e:  # noqa: BLE001
                raise RuntimeError(f"{e} ({type(e.__cause__).__name__}: {e.__cause__}); no --data-path/--split, "
                                   "--train/valid/test-data-path or --mock-data") from e
            raise RuntimeError("no data flags, yet GPTDataset built from nothing: check this harness")

    if not run("import", do_import) or (gpu_shims and not run("gpu-shims", do_gpu_shims)) \
            or not run("parse", do_parse) or not run("validate", do_validate):
        return 0
    # Past validation the steps are independent enough that each failure is worth seeing.
    for name, fn in [("globals", do_globals), ("tokenizer", do_tokenizer), ("model-config", do_model_config),
                     ("config-container", do_config_container), ("train-iters", do_train_iters)]:
        run(name, fn)
    # pretrain() calls get_optimizer_param_scheduler() (which completes train_iters for --train-samples via
    # update_train_iters) before it sizes the datasets, so the sizes are only meaningful after it.
    if runtime_of(plan_dir) == "deepspeed":
        # dsorch's bundled entrypoint runs this plan: it takes data and checkpoints from its own
        # command line, so the plan carries no Megatron data flags and pretrain() never sizes datasets.
        facts["data-steps"] = "not run: runtime deepspeed (the bundled entrypoint reads no Megatron data flags)"
        save()
        return 0
    for name, fn in [("train-samples", do_train_samples if steps["train-iters"] is None else None),
                     ("data-config", do_data_config)]:
        if fn is None:
            steps[name] = "skipped: needs train-iters"
            save()
            continue
        run(name, fn)
    return 0


if __name__ == "__main__":
    sys.exit(main())
