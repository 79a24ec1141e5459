"""dsorch's bundled training entrypoint (``python -m orchestrator.train --plan PLAN_DIR``).

__main__.py    the stop request first (stop.py, standard library only), then the loop
stop.py        SIGUSR2 / SIGTERM / the run directory's stop request, the exit codes
loop/          the training loop (entry.py: start here), the plan it trains (config.py), the launch
               edge (launch.py, hosts.py), learning rate, evaluation, step records and their sinks,
               the memory and schedule censuses
model/         the Llama-style decoder as pipeline layers (decoder.py), tensor- and expert-parallel
               layers (tensor_parallel.py, moe.py), Hugging Face weights in and out, full weights
data/          samples by index (datasets.py: synthetic, Megatron-LM indexed, legacy token files), the
               indexed format (indexed.py), text to it (prepare.py, token_file.py), what a run trains on
               (fingerprint.py)
checkpoint/    save / resume / retention / damaged-checkpoint fallback (store.py), DeepSpeed's universal
               checkpoint for `dsorch replan` (reshard.py)
"""
