"""`dsorch export-hf`: a run's newest checkpoint as a Hugging Face model directory."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli.common import cwd_project, display_path, ds_env
from orchestrator.plandir.rundir import RunDir


@click.command(
    "export-hf",
    epilog="""\b
Examples:
  dsorch export-hf runs/llama3-8b-dgx16-3                    # writes runs/llama3-8b-dgx16-3/hf-stepN/
  dsorch export-hf plans/tiny/run --out models/tiny-hf
  python -c "from transformers import AutoModelForCausalLM; AutoModelForCausalLM.from_pretrained('models/tiny-hf')"
""",
)
@click.argument("run", metavar="RUN_DIR|JOB")
@click.option(
    "--out",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The model directory to write (default: RUN_DIR/hf-stepN); it must not exist.",
)
def export_hf(run, out):
    """Write the newest intact checkpoint of a run as a Hugging Face model directory.

    safetensors shards, model.safetensors.index.json and config.json (Llama, or Qwen2 for a model
    with q/k/v biases), plus the tokenizer files when the spec's training.data.tokenizer names a
    local Hugging Face tokenizer. Any layout: tensor-parallel slices are joined, pipeline stages
    gathered, ZeRO-3 partitions merged with DeepSpeed's zero_to_fp32 (at tp 1). Written in OUT.tmp
    and renamed into place; the same checkpoint gives the same bytes.
    """
    from orchestrator.run.replan import find_run, newest_checkpoint
    from orchestrator.train.model.hf_weights import export_checkpoint

    ds_env()
    run_dir = find_run(cwd_project(), run)
    ckpt = newest_checkpoint(RunDir(run_dir).checkpoints)
    out = out or run_dir / f"hf-{ckpt.path.name}"
    export_checkpoint(ckpt.path, ckpt.layout, ckpt.plan.spec, out)
    click.echo(f"wrote {display_path(out)}/ from the checkpoint of step {ckpt.step} in {display_path(run_dir)}")
    click.echo(f"  load it: AutoModelForCausalLM.from_pretrained({str(out)!r})")
