"""``python -m orchestrator.train --plan PLAN_DIR [--steps N] [--data PATH] [--run-dir DIR]``;
see loop/entry.py for the launch commands."""

import os
import sys

from orchestrator.errors import DsorchError
from orchestrator.train.stop import EXIT_OUT_OF_MEMORY, StopRequest

# Before the heavy imports below (seconds of torch and DeepSpeed): a SIGUSR2/SIGTERM during
# start-up must request a stop, not kill the rank with the default action.
stop = StopRequest()

from orchestrator.train.loop.entry import DeviceMemoryExceeded, main  # noqa: E402  (after the handlers: see above)

try:
    main(stop=stop)
except DsorchError as e:  # a problem with the plan or data, not a bug: one paragraph, exit code 2 as the CLI's
    # One write: every rank reports it, and two ranks' lines must not interleave on a shared terminal.
    sys.stderr.write(f"orchestrator.train: {e}\n")
    sys.stderr.flush()
    sys.exit(2)
except DeviceMemoryExceeded as e:
    print(f"orchestrator.train: {e}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    # os._exit, as launch.teardown does: gloo may abort a rank during interpreter shutdown.
    os._exit(EXIT_OUT_OF_MEMORY)
