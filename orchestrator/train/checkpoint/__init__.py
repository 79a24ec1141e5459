"""The bundled entrypoint's checkpoints: the directory's format, save, resume, retention and the
fallback past a damaged one (store.py), and DeepSpeed's universal checkpoint for `dsorch replan`
(reshard.py)."""
