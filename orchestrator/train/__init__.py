"""dsorch's bundled training entrypoint (``python -m orchestrator.train --plan PLAN_DIR``).

entry.py       the training loop (start here)
config.py      reads the plan directory: model shape and layout
launch.py      the launch edge: torchrun / SLURM environment, process group up and down
tensor_parallel.py  Megatron-style column/row-parallel linears, vocab-parallel embedding and
               cross-entropy, sequence parallelism
model.py       Llama-style decoder as pipeline layers; DeepSpeed PipelineModule wrapper
data.py        the samples: synthetic tokens, Megatron-LM indexed datasets (blend, split), legacy token files
indexed.py     Megatron-LM's indexed dataset format (PREFIX.bin + PREFIX.idx): reader and writer
prepare.py     text to an indexed dataset with a Hugging Face tokenizer (`dsorch data prepare`)
fingerprint.py what a run trains on, kept in each checkpoint's manifest and checked at resume
token_file.py  text -> legacy token file (bytes tokenizer), `python -m orchestrator.train.token_file`
checkpoint.py  save / resume / retention / damaged-checkpoint fallback
metrics.py     step metrics and their records in the run directory
"""
