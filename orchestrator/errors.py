"""Domain errors. The CLI turns each into one readable paragraph and exit code 2."""


class DsorchError(Exception):
    """Base class: a problem with the user's input or environment, not a bug."""


class SpecError(DsorchError):
    """A model spec or cluster profile is malformed or inconsistent."""


class ProfileNotFound(DsorchError):
    """A cluster profile name that no profile directory provides."""


class LayoutError(DsorchError):
    """A pinned layout that breaks a legality rule."""


class NoFeasibleLayout(DsorchError):
    """Every legal layout exceeds the GPU memory."""


class InvalidFile(DsorchError):
    """A file dsorch reads or wrote that it, DeepSpeed or Megatron-LM rejects: a plan directory or one of
    its generated configs, a token file. (Named apart from pydantic's ValidationError.)"""


class OutputError(DsorchError):
    """The output directory cannot be written."""


class JobError(DsorchError):
    """A job, its scheduler or the job registry: SLURM's tools missing, a job that cannot be
    submitted, found or followed, a damaged registry."""


class CheckpointError(DsorchError):
    """A run's checkpoint that cannot be resumed from or converted to another layout."""
