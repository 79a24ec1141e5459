"""The bundled entrypoint's model: the Llama-style decoder as pipeline layers (decoder.py), its
tensor-parallel layers (tensor_parallel.py), the mixture-of-experts layer (moe.py), Hugging Face weights
in and out (hf_weights.py) and the full weights from any layout (gather.py)."""
