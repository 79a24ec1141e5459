"""``python -m orchestrator.train --plan PLAN_DIR [--steps N] [--data PATH] [--run-dir DIR]``;
see entry.py for the launch commands."""

import sys

from .stop import StopRequest

# Before the heavy imports below (seconds of torch and DeepSpeed): a SIGUSR2/SIGTERM during
# start-up must request a stop, not kill the rank with the default action.
stop = StopRequest()

from ..errors import DsorchError  # noqa: E402
from .entry import main  # noqa: E402

try:
    main(stop=stop)
except DsorchError as e:  # a problem with the plan or data, not a bug: one readable line
    sys.exit(f"orchestrator.train: {e}")
