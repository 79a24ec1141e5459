"""dsorch: plan, emit and launch 3D-parallel LLM training (DeepSpeed / Megatron-LM) on SLURM."""

__version__ = "0.1.0"
