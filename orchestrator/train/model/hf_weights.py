"""Hugging Face weights in and out of dsorch's model: the one home of the name mapping.

In (``training.init_from``): a local Llama / Mistral / Qwen2 directory (config.json and
``*.safetensors``, sharded with ``model.safetensors.index.json`` or not) is loaded into the module a
rank builds, before ``deepspeed.initialize`` (ZeRO-3 partitions the weights there). Each rank reads
only the slices its parameters hold, through safetensors' lazy ``safe_open(...).get_slice``.

Out (``dsorch export-hf``): the newest intact checkpoint of a run, any layout, merged to full tensors
and written as a Hugging Face directory that ``AutoModelForCausalLM.from_pretrained`` loads.

dsorch's layers against transformers' (models/llama/modeling_llama.py, models/qwen2/modeling_qwen2.py
@ 5.24): the same RMSNorm (fp32 statistics, then weight), rotate-half RoPE (``rotate_half``), GQA,
SwiGLU (``down(silu(gate) * up)``); dsorch fuses q, k, v into one column-parallel GEMM and gate, up
into another, each tp rank holding the r-th slice of every block (train/model/tensor_parallel.py), so one
dsorch parameter is several HF tensors, sliced per block.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from orchestrator.errors import CheckpointError, InvalidFile
from orchestrator.spec.model import ModelSpec, SpecFile

# The model families (spec/hf_import.py HF_FAMILIES, by name) whose transformers model is dsorch's layer,
# so whose weights training.init_from loads (checked by tests/system/test_hf_weights.py).
WEIGHT_FAMILIES = ("llama", "mistral", "qwen2")
INDEX = "model.safetensors.index.json"
# Shards of the export: transformers' save_pretrained default (max_shard_size "50GB" in 5.x is one
# file per model at these sizes; 5 GB keeps files a filesystem and an upload handle comfortably).
SHARD_BYTES = 5 * 1024**3
# The model's spec keys that say nothing about the weights' values: not compared with config.json.
_NOT_COMPARED = {"max_position_embeddings", "init_method_std", "sliding_window", "kv_channels", "num_kv_heads"}
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")


def hf_names(model: ModelSpec, name: str) -> tuple[str, ...]:
    """The HF tensors that make dsorch parameter ``name`` (the pp = 1 naming, reshard.dense_name), in
    the order of its fused blocks: ``layers.3.qkv.weight`` is q_proj, k_proj, v_proj of layer 2."""
    m = _LAYER.match(name)
    if not m:
        raise InvalidFile(f"dsorch parameter {name} has no Hugging Face name (a bug: report it)")
    i, rest = int(m.group(1)), m.group(2)
    if i == 0 and rest == "word.weight":
        return ("model.embed_tokens.weight",)
    if i == model.num_layers + 1 and rest == "weight":
        return ("model.norm.weight",)
    if i == model.num_layers + 2 and rest == "proj.weight":
        return ("lm_head.weight",)
    p, kind = f"model.layers.{i - 1}.", rest.rsplit(".", 1)[-1]
    table = {
        "input_norm.weight": ("input_layernorm.weight",),
        "post_norm.weight": ("post_attention_layernorm.weight",),
        f"qkv.{kind}": tuple(f"self_attn.{x}_proj.{kind}" for x in "qkv"),
        f"out.{kind}": (f"self_attn.o_proj.{kind}",),
        f"up.{kind}": (f"mlp.gate_proj.{kind}", f"mlp.up_proj.{kind}") if model.gated else (f"mlp.up_proj.{kind}",),
        f"down.{kind}": (f"mlp.down_proj.{kind}",),
        "q_norm": ("self_attn.q_norm.weight",),
        "k_norm": ("self_attn.k_norm.weight",),
    }
    if not 1 <= i <= model.num_layers or rest not in table:
        raise InvalidFile(f"dsorch parameter {name} has no Hugging Face name (a bug: report it)")
    return tuple(p + x for x in table[rest])


# --------------------------------------------------------------------------- in


def check_config(directory: Path, spec: SpecFile) -> None:
    """The plan's model is the one ``directory``'s config.json describes, read by `dsorch import-hf`'s
    reader (spec/hf_import.py): every key of the model that shapes or computes, compared."""
    from orchestrator.spec.hf_import import import_config

    cfg = directory / "config.json"
    if not cfg.is_file():
        raise InvalidFile(
            f"training.init_from {directory}: no config.json there; give a Hugging Face model directory "
            "(config.json and *.safetensors, as save_pretrained writes it)"
        )
    imp = import_config(cfg)
    if imp.family not in WEIGHT_FAMILIES:
        raise InvalidFile(
            f"{cfg}: a {imp.family} model; training.init_from loads the {', '.join(WEIGHT_FAMILIES)} families, whose "
            "layers are dsorch's (train/model/decoder.py)"
        )
    if imp.notes:
        raise InvalidFile(
            f"{cfg}: dsorch's model would compute another function with these weights: {'; '.join(imp.notes)}. "
            "training.init_from loads only what the spec carries whole"
        )
    seq = spec.training.seq_length
    if imp.window is not None and seq > imp.window:
        raise InvalidFile(
            f"{cfg}: sliding_window {imp.window} is shorter than training.seq_length {seq}, and the bundled "
            f"entrypoint attends to the whole sequence; train with seq_length <= {imp.window}"
        )
    theirs = ModelSpec.model_validate(imp.model)
    diffs = [
        f"model.{key}: the spec has {getattr(spec.model, key)!r}, config.json {getattr(theirs, key)!r}"
        for key in [*ModelSpec.model_fields, "kv_heads", "head_dim"]
        if key not in _NOT_COMPARED and getattr(spec.model, key) != getattr(theirs, key)
    ]
    if diffs:
        raise InvalidFile(
            f"training.init_from {directory}: the plan's model is not the one its config.json describes: "
            f"{'; '.join(diffs)}. Make the spec with `dsorch import-hf {cfg}` (or fix these keys) and plan again"
        )


def tensor_files(directory: Path) -> dict[str, Path]:
    """Each tensor's safetensors file: from the index of a sharded save, else from the files' headers."""
    index = directory / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            return {str(k): directory / str(v) for k, v in weight_map.items()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise InvalidFile(
                f"{index}: not a safetensors index ({e}); it maps tensor names under weight_map"
            ) from None
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise InvalidFile(
            f"training.init_from {directory}: no *.safetensors files; dsorch reads safetensors only (save the "
            "model with save_pretrained(..., safe_serialization=True))"
        )
    out = {}
    for f in files:
        with _open(f) as st:
            out.update({k: f for k in st.keys()})
    return out


def _open(path: Path):
    from safetensors import safe_open

    try:
        return safe_open(str(path), framework="pt")
    except Exception as e:  # safetensors raises its own SafetensorError, OSError or ValueError by cause
        raise InvalidFile(f"{path}: not a readable safetensors file ({' '.join(str(e).split())[:300]})") from None


def _full_shape(shard: torch.Size, split, block: int, tp: int) -> tuple[int, ...]:
    if split is None:
        return tuple(shard)
    dim, parts = split
    full = list(shard)
    full[dim] = parts[block] if len(parts) > 1 else shard[dim] * tp
    return tuple(full)


def load_init_from(module: torch.nn.Module, spec: SpecFile, tp_rank: int, tp_size: int) -> None:
    """Copy ``spec.training.init_from``'s weights into ``module``'s parameters (this rank's stage and
    tp slices), reading each tensor's slice lazily."""
    from orchestrator.train.checkpoint.reshard import dense_name

    directory = Path(str(spec.training.init_from))
    check_config(directory, spec)
    files = tensor_files(directory)
    with contextlib.ExitStack() as stack:
        opened: dict[Path, Any] = {}
        for name, p in module.named_parameters():
            split = getattr(p, "tp_split", None)
            pieces = []
            for block, hf in enumerate(hf_names(spec.model, dense_name(name))):
                if hf not in files:
                    raise InvalidFile(f"training.init_from {directory}: no tensor {hf} (for dsorch's {name})")
                if files[hf] not in opened:
                    opened[files[hf]] = stack.enter_context(_open(files[hf]))
                piece = opened[files[hf]].get_slice(hf)
                shape, want = tuple(piece.get_shape()), _full_shape(p.shape, split, block, tp_size)
                if shape != want:
                    raise InvalidFile(
                        f"{files[hf]}: tensor {hf} has shape {list(shape)}; the spec's model needs {list(want)}"
                    )
                if split is None:
                    pieces.append(piece[:])
                    continue
                n = want[split[0]] // tp_size
                rows = slice(tp_rank * n, (tp_rank + 1) * n)
                pieces.append(piece[rows] if split[0] == 0 else piece[:, rows])
            with torch.no_grad():
                p.copy_(torch.cat(pieces, dim=split[0]) if split else pieces[0])


# --------------------------------------------------------------------------- out


def tp_split_of(model: ModelSpec, name: str, shard: torch.Tensor, tp: int) -> tuple[int, list[int]] | None:
    """How parameter ``name`` is split over tp ranks, from the facts the universal checkpoint carries
    (reshard.universal_info, their one home): None when replicated, else (dim, full block sizes)."""
    from orchestrator.train.checkpoint.reshard import universal_info

    info = universal_info(model)
    if any(re.match(p, name) for p in info["tp_replicated_parameter_patterns"]):
        return None
    if any(re.match(p, name) for p in info["parameter_with_row_parallelism_patterns"]):
        return 1, [shard.shape[1] * tp]
    for sub in info["parameter_with_sub_params"]:
        if any(re.match(p, name) for p in sub["patterns"]):
            return 0, list(sub["shape"][0])
    if any(re.match(p, name) for p in info.get("parameter_with_2_sub_params_cat_dim_0", [])):
        return 0, [shard.shape[0] * tp // 2] * 2
    return 0, [shard.shape[0] * tp]


def _tp_states(tag_dir: Path, model: ModelSpec, layout) -> list[dict[str, torch.Tensor]]:
    """Each tp rank's module weights (pp = 1 naming) from DeepSpeed's model-state files: pp = 1,
    ``mp_rank_XX_model_states.pt`` 'module'; pp > 1, one ``layer_II-model_XX-model_states.pt`` per
    layer and tp rank (PipelineModule.ckpt_layer_path), written by data-parallel rank 0."""
    out = []
    for r in range(layout.tp):
        if layout.pp == 1:
            state = torch.load(tag_dir / f"mp_rank_{r:02d}_model_states.pt", map_location="cpu", weights_only=False)
            out.append(dict(state["module"]))
            continue
        merged = {}
        for f in sorted(tag_dir.glob(f"layer_*-model_{r:02d}-model_states.pt")):
            i = int(f.name.split("-")[0][len("layer_") :])
            for k, v in torch.load(f, map_location="cpu", weights_only=False).items():
                merged[f"layers.{i}.{k}"] = v
        out.append(merged)
    return out


def full_state(tag_dir: Path, model: ModelSpec, layout) -> dict[str, torch.Tensor]:
    """The checkpoint's model, every tensor whole, by dsorch's pp = 1 names."""
    from orchestrator.train.model.gather import join_blocks

    if layout.zero_stage == 3:
        if layout.tp > 1:
            raise CheckpointError(
                f"{tag_dir}: a ZeRO-3 checkpoint at tp {layout.tp}; DeepSpeed's zero_to_fp32 merges the "
                "data-parallel partitions of one model-parallel rank only (it counts every *_optim_states.pt "
                "as a data-parallel partition), so it cannot export this layout. Export a ZeRO-1/2 run, or "
                "`dsorch replan` to one first"
            )
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        with contextlib.redirect_stdout(io.StringIO()):
            return dict(get_fp32_state_dict_from_zero_checkpoint(str(tag_dir.parent), tag=tag_dir.name))
    states = _tp_states(tag_dir, model, layout)
    full = {}
    for name, first in states[0].items():
        split = tp_split_of(model, name, first, layout.tp)
        shards = [s[name] for s in states]
        full[name] = first if split is None or layout.tp == 1 else join_blocks(shards, *split)
    return full


def hf_config(model: ModelSpec, dtype: torch.dtype) -> dict:
    """config.json of the exported model: Qwen2 when only q, k and v have biases (Qwen2Attention),
    else Llama (attention_bias and mlp_bias for biases everywhere; a Mistral without a sliding window is
    the same model)."""
    if model.moe is not None or model.activation != "swiglu" or model.normalization != "rmsnorm":
        raise CheckpointError(
            "export-hf writes Llama and Qwen2 models (SwiGLU, RMSNorm, no experts); this model has "
            f"activation {model.activation}, normalization {model.normalization}"
            + (", experts" if model.moe is not None else "")
        )
    if model.position_embedding != "rope" or model.parallel_residual or model.qk_norm:
        raise CheckpointError("export-hf writes Llama and Qwen2 models: RoPE, sequential blocks, no QK-norm")
    qwen = model.qkv_bias
    doc: dict[str, Any] = {
        "architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
        "model_type": "qwen2" if qwen else "llama",
        "hidden_size": model.hidden_size,
        "intermediate_size": model.ffn_hidden_size,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.kv_heads,
        "head_dim": model.head_dim,
        "vocab_size": model.vocab_size,
        "hidden_act": "silu",
        "rms_norm_eps": model.norm_epsilon,
        "rope_theta": model.rope_theta,
        "max_position_embeddings": model.max_position_embeddings or 4096,
        "tie_word_embeddings": model.tied_embeddings,
        "initializer_range": model.init_method_std,
        # transformers 5 reads dtype, 4.x torch_dtype (PretrainedConfig).
        "dtype": str(dtype).removeprefix("torch."),
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if not qwen:
        doc.update(attention_bias=model.bias, mlp_bias=model.bias)
    return doc


def to_hf(model: ModelSpec, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """dsorch's full tensors as Hugging Face's: fused blocks split back into their parts."""
    out = {}
    for name in sorted(state):
        t = state[name]
        hf = hf_names(model, name)
        if len(hf) == 1:
            out[hf[0]] = t.contiguous()
            continue
        sizes = [model.num_attention_heads * model.head_dim] + [model.kv_heads * model.head_dim] * 2
        for part, piece in zip(hf, t.split(sizes if "qkv" in name else t.shape[0] // 2, dim=0), strict=True):
            out[part] = piece.contiguous()
    return out


def _tokenizer_files(spec: SpecFile) -> list[Path]:
    tok = spec.training.data.tokenizer
    if tok.type != "HuggingFaceTokenizer" or tok.model is None:
        return []
    where = Path(tok.model)
    if where.is_file():
        return [where]
    names = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")
    return [where / n for n in names if (where / n).is_file()] if where.is_dir() else []


def write_hf(out: Path, model: ModelSpec, state: dict[str, torch.Tensor], spec: SpecFile) -> None:
    """``out`` as a Hugging Face directory, written in ``out``.tmp and renamed into place."""
    from safetensors.torch import save_file

    tensors = to_hf(model, state)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = tensors[name]
        size += nbytes
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(tmp / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    dtype = next(iter(tensors.values())).dtype
    for fname, doc in ((INDEX, index), ("config.json", hf_config(model, dtype))):
        (tmp / fname).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    for f in _tokenizer_files(spec):
        shutil.copyfile(f, tmp / f.name)
    os.replace(tmp, out)


def export_checkpoint(tag_dir: Path, layout, spec: SpecFile, out: Path) -> None:
    """Checkpoint ``tag_dir`` (written by ``layout``, of ``spec``'s model) as a Hugging Face directory ``out``."""
    if out.exists():
        raise CheckpointError(f"{out} exists; remove it or export with --out to another directory")
    hf_config(spec.model, torch.float32)  # refuses what Hugging Face's Llama / Qwen2 cannot hold, before reading
    write_hf(out, spec.model, full_state(tag_dir, spec.model, layout), spec)
