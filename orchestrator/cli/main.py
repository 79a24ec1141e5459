"""The `dsorch` command. Thin: parse, call the core, print. Domain errors become one paragraph and
exit code 2 in one place, ``DsorchGroup``."""

from __future__ import annotations

import click

from orchestrator import __version__
from orchestrator.cli.calibrate import calibrate
from orchestrator.cli.common import EPILOG, UserError, user_error
from orchestrator.cli.data import data
from orchestrator.cli.doctor import doctor
from orchestrator.cli.jobs import cancel, logs, status
from orchestrator.cli.planning import plan
from orchestrator.cli.replan import replan
from orchestrator.cli.reviewing import diff, plot, validate
from orchestrator.cli.setup import completion, import_hf, init, profiles
from orchestrator.cli.submit import submit
from orchestrator.cli.trial import trial
from orchestrator.cli.weights import export_hf
from orchestrator.errors import DsorchError


class DsorchGroup(click.Group):
    """The one place a domain error becomes one paragraph and exit code 2: every command raises
    DsorchError (orchestrator.errors) and this turns it into a UserError."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except DsorchError as e:
            raise user_error(e) from None
        except BrokenPipeError:
            # The reader went away (`dsorch logs JOB | head`): not a path problem. click's
            # BaseCommand.main ends quietly on EPIPE (exit code 1, no message), as `cat` does.
            raise
        except OSError as e:
            # The last net for the filesystem (a path too long, a disk full, permissions): the
            # modules raise DsorchError with a fix where they can; this keeps the rest one line.
            where = f"{e.filename}: " if e.filename else ""
            raise UserError(f"{where}{e.strerror or e}; check the path and that you can write there.") from None
        except RecursionError:
            raise UserError("the input is nested too deeply to be a dsorch file or path.") from None


@click.group(
    cls=DsorchGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
@click.version_option(__version__, "--version", "-V", prog_name="dsorch", message="%(prog)s %(version)s")
def main() -> None:
    """dsorch plans 3D-parallel LLM training for a SLURM cluster and writes the files to run it.

    Give it a model spec (examples/*.yaml) and a cluster profile (`dsorch profiles`); it searches
    every legal layout of tensor, pipeline and data parallelism, ZeRO stage, micro-batch,
    recomputation and sequence parallelism, predicts memory per GPU and step time for each, and
    writes a validated ds_config.json, Megatron-LM flags, a launch script and an sbatch job.
    """


for command in (
    plan,
    plot,
    diff,
    validate,
    completion,
    import_hf,
    export_hf,
    profiles,
    init,
    submit,
    status,
    logs,
    cancel,
    replan,
    trial,
    calibrate,
    doctor,
    data,
):
    main.add_command(command)
