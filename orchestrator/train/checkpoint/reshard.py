"""Resharding a run's checkpoint to another layout with DeepSpeed's universal checkpoint.

DeepSpeed's checkpoints are per rank: a TP slice, a pipeline stage, a ZeRO partition of the
optimizer. Its universal checkpoint (``deepspeed.checkpoint.ds_to_universal``; Lian et al.,
"Universal Checkpointing", 2024) merges them into one full tensor per parameter (fp32 weights and
both Adam moments), from which an engine of any TP x PP x DP loads its own slices
(``"checkpoint": {"load_universal": true}``).

What it needs from dsorch, measured on CPU with DeepSpeed 0.19.8 (tp2 x pp2 ZeRO-1 resharded to
tp1 x pp2 x dp2, tp1 x pp1 x dp2 and tp2 x pp1: the next losses equal the uninterrupted run's
to the last digit in fp32):

* How each parameter is split over TP ranks (``universal_info``), saved with every checkpoint
  (client_state ``universal_checkpoint_info``; key names from deepspeed/checkpoint/constants.py).
  Without it the fused QKV and gate/up weights load silently wrong at a new TP degree.
* The same parameter names on both sides: DeepSpeed's PipelineModule names a layer's parameters
  ``<index>.<name>`` (a tied embedding ``tied_modules.<key>.<name>``), dsorch's DenseModel (pp = 1)
  ``layers.<index>.<name>``; ``rename_for`` renames the converted folders for the target.
* ZeRO-1 or ZeRO-2 on both sides: the converter reads ``*_optim_states.pt`` (a ZeRO-0 run writes
  none) and the engine loads universal checkpoints only inside its ZeRO optimizer; ZeRO-3 writes
  another file layout and reshards to tp > 1 only with AutoTP metadata (``convertible``).
* ep = 1 on both sides for mixture-of-experts models: at ep = 1 the experts are ordinary
  parameters and convert like the dense MLP (``universal_info`` names the router and gates); at
  ep > 1 DeepSpeed writes native MoE checkpoints, which its converter does not handle
  (``convertible`` says why).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
from pathlib import Path

from orchestrator.errors import CheckpointError
from orchestrator.train.checkpoint.store import MANIFEST, file_digests

# dsorch's manifest in a converted directory (the native checkpoints' is checkpoint.MANIFEST).
NAMING_PIPELINE, NAMING_DENSE = "pipeline", "dense"


def naming(pp: int) -> str:
    return NAMING_PIPELINE if pp > 1 else NAMING_DENSE


def universal_info(model) -> dict:
    """``universal_checkpoint_info`` for dsorch's model (orchestrator/train/model/decoder.py): regexes
    ``re.match``ed against parameter names, in either naming. Only patterns of parameters that
    exist: the converter's strict mode refuses one that matches nothing."""
    d = model.head_dim
    q, kv = model.num_attention_heads * d, model.kv_heads * d
    replicated = [r".*norm\.weight$", r"^(layers\.)?\d+\.weight$"]  # decoder norms; the final Norm layer
    if model.normalization == "layernorm":  # LayerNorm has a bias whatever model.bias says
        replicated += [r".*norm\.bias$", r"^(layers\.)?\d+\.bias$"]
    if model.bias:
        replicated.append(r".*\.(out|down)\.bias$")
    if model.position_embedding == "learned":
        replicated.append(r".*\.pos$")
    if model.qk_norm:
        replicated.append(r".*\.(q|k)_norm$")
    if model.moe is not None:  # train/model/moe.py: the router (and its bias) and the shared experts' gate
        replicated.append(r".*\.moe\.router(_bias)?$")
        if model.moe.shared_expert_gate:
            replicated.append(r".*\.moe\.shared_gate$")
    info = {
        "tp_replicated_parameter_patterns": replicated,
        # RowParallelLinear splits the input dimension: the slices join along dim 1.
        "parameter_with_row_parallelism_patterns": [r".*\.(out|down)\.weight$"],
        # ColumnParallelLinear of fused GEMMs: each TP rank holds [q_r; k_r; v_r], not a contiguous
        # block of [q; k; v] (tensor_parallel.py), so the converter must know the parts' sizes.
        "parameter_with_sub_params": [
            {"patterns": [r".*\.qkv\.weight$"], "shape": ((q, kv, kv), model.hidden_size), "partition_dim": 0}
        ]
        + (
            [{"patterns": [r".*\.qkv\.bias$"], "shape": ((q, kv, kv),), "partition_dim": 0}]
            if model.bias or model.qkv_bias
            else []
        ),
    }
    if model.gated:  # [gate_r; up_r] per TP rank
        info["parameter_with_2_sub_params_cat_dim_0"] = [r".*\.up\.weight$"] + (
            [r".*\.up\.bias$"] if model.bias else []
        )
    if model.tied_embeddings:
        # The tied embedding lives on the first and the last stage; take it from one.
        info["pipeline_replicated_parameter_patterns"] = [r"^tied_modules\."]
    return info


def convertible(source, target) -> list[str]:
    """Why a checkpoint of layout ``source`` cannot be loaded as layout ``target`` (empty: it can)."""
    problems = []
    for what, lay in (("the run's", source), ("the new", target)):
        if lay.zero_stage not in (1, 2):
            problems.append(
                f"{what} layout {lay.short()} is ZeRO-{lay.zero_stage}; DeepSpeed's universal checkpoint converts "
                f"and loads ZeRO-1/2 only (ZeRO-0 writes no optimizer partition files; ZeRO-3 writes another file "
                f"layout and reshards to tp > 1 only with AutoTP metadata)"
            )
    if target.vpp != 1 or source.vpp != 1:
        problems.append("vpp > 1 is not in DeepSpeed's pipeline engine")
    if source.ep > 1 or target.ep > 1:
        problems.append(
            f"expert parallelism (the run's ep {source.ep}, the new ep {target.ep}) is not converted: at ep > 1 "
            "DeepSpeed checkpoints the routed experts as native MoE layers (one file per expert and layer, their "
            "optimizer state partitioned over the expert data-parallel group), and its universal checkpoint "
            "converter (ds_to_universal, 0.19) merges ZeRO partitions over the data-parallel group and knows "
            "only AutoEP's expert layout, so it would merge the experts' partitions wrongly. A run at ep > 1 "
            "resumes with the plan that wrote it (or another of its layout); one trained at ep 1 converts like a "
            "dense model, to ep 1 layouts"
        )
    return problems


def dense_name(name: str) -> str:
    """A parameter name of the pipeline model (``<index>.<name>``, ``tied_modules.embed.``) as the
    pp = 1 model names it (``layers.<index>.<name>``); other names unchanged."""
    m = re.match(r"^(\d+)\.(.+)$", name)
    if m:
        return f"layers.{m.group(1)}.{m.group(2)}"
    if name.startswith("tied_modules.embed."):
        return "layers.0." + name[len("tied_modules.embed.") :]
    return name


def _pipeline_name(name: str, tied: bool) -> str:
    m = re.match(r"^layers\.(\d+)\.(.+)$", name)
    if not m:
        return name
    if tied and m.group(1) == "0":
        return f"tied_modules.embed.{m.group(2)}"
    return f"{m.group(1)}.{m.group(2)}"


def rename_for(universal_dir: Path, target: str, tied: bool) -> None:
    """Rename the per-parameter folders (``zero/<name>/``) to the ``target`` naming."""
    zero = Path(universal_dir) / "zero"
    for p in sorted(zero.iterdir()):
        if not p.is_dir():
            continue
        new = dense_name(p.name) if target == NAMING_DENSE else _pipeline_name(p.name, tied)
        if new != p.name:
            os.rename(p, zero / new)


def convert(tag_dir: Path, out_dir: Path, target_naming: str, tied: bool, manifest: dict) -> None:
    """``tag_dir`` (a native checkpoint) to a universal one in ``out_dir``, named for the target;
    written beside it first and renamed into place, so a crash leaves no half-converted directory.
    ``manifest`` (step, source layout) goes into it with the naming, as dsorch_manifest.json."""
    import argparse

    from deepspeed.checkpoint.ds_to_universal import main as ds_to_universal

    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    # The converter prints its progress bars and notes; they are shown only if it fails.
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            # num_*_workers=1: in this process (the default starts pools of 4 and 2 workers).
            ds_to_universal(
                argparse.Namespace(
                    input_folder=str(tag_dir),
                    output_folder=str(tmp),
                    num_extract_workers=1,
                    num_merge_workers=1,
                    keep_temp_folder=False,
                    strict=True,
                    inject_missing_state=False,
                )
            )
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        tail = "\n".join(said.getvalue().strip().splitlines()[-15:])
        raise CheckpointError(
            f"DeepSpeed's ds_to_universal could not convert {tag_dir}: {type(e).__name__}: "
            f"{' '.join(str(e).split())[:500]}\n{tail}"
        ) from None
    # The converter also writes `latest_universal` beside its output; dsorch chooses by manifest.
    (tmp.parent / "latest_universal").unlink(missing_ok=True)
    rename_for(tmp, target_naming, tied)
    (tmp / MANIFEST).write_text(
        json.dumps(
            {**manifest, "universal": True, "naming": target_naming, "files": file_digests(tmp)},
            indent=1,
            sort_keys=True,
        ),
        encoding="utf-8",
    )
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
