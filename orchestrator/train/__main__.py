"""``python -m orchestrator.train --plan PLAN_DIR [--steps N] [--data PATH] [--run-dir DIR]``;
see entry.py for the launch commands."""

import sys

from ..errors import DsorchError
from .entry import main

try:
    main()
except DsorchError as e:  # a problem with the plan or data, not a bug: one readable line
    sys.exit(f"orchestrator.train: {e}")
