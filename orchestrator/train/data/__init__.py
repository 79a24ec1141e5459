"""What the bundled entrypoint trains on: samples by index (datasets.py), Megatron-LM's indexed
format (indexed.py), text to it (prepare.py) or to a legacy token file (token_file.py), and the
record of a run's data that every checkpoint keeps (fingerprint.py)."""
