#!/usr/bin/env python3
"""Turn text into a dsorch token file (NAME.bin + NAME.json): a wrapper kept for existing commands;
the code is the installed module orchestrator/train/data/token_file.py (`python -m
orchestrator.train.data.token_file`), so an installed dsorch needs no checkout for it."""

import sys

from orchestrator.train.data.token_file import main

if __name__ == "__main__":
    sys.exit(main(prog="scripts/make_token_file.py"))
