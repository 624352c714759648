"""The command line: one module per command (theinference/commands/), registered here, and
one way out for errors.

Heavy imports (NumPy, the oracle, rich) happen inside command bodies so `--help` is instant.
An error the user can fix becomes one message on stderr and its exit code (exits.py), never a
traceback: EXIT_CODES below is the only place that decides which code.
"""

import functools

import typer

from theinference import __version__, exits
from theinference.commands import bench, gradescope, init, stages, test, verify
from theinference.commands import grade as classroom
from theinference.commands import report as class_report
from theinference.commands.options import command_group

app = command_group(
    "Grade a KV cache for GPT-2, stage by stage, against a NumPy recompute oracle.",
    add_completion=False,
)


def exit_codes() -> dict[type, int]:
    """Each user error's exit code (imported late: these modules load NumPy)."""
    from theinference.course.directory import CourseError
    from theinference.course.languages import LanguageError
    from theinference.curriculum.stages import StageError
    from theinference.grading.bench import BenchError
    from theinference.grading.verify import VerifyError
    from theinference.oracle.weights import WeightsError
    from theinference.student.sandbox import SandboxError

    return {
        CourseError: exits.COURSE,
        WeightsError: exits.WEIGHTS,
        StageError: exits.USAGE,
        LanguageError: exits.USAGE,
        SandboxError: exits.USAGE,
        VerifyError: exits.USAGE,
        BenchError: exits.NOT_PASSED,
        OSError: exits.USAGE,  # e.g. a results file that cannot be written
    }


def user_error(exc: Exception) -> tuple[str, int] | None:
    """The message and exit code of an error the user can fix; None for a grader bug."""
    if isinstance(exc, exits.Abort):
        return str(exc), exc.code
    for kind, code in exit_codes().items():
        if isinstance(exc, kind):
            if isinstance(exc, OSError) and exc.strerror:
                return f"{exc.strerror}: {exc.filename or ''}", code
            return str(exc), code
    return None


def handled(command):
    """The command, with user errors turned into a message and an exit code."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except KeyboardInterrupt:
            raise typer.Exit(exits.INTERRUPTED) from None
        except Exception as exc:
            found = user_error(exc)
            if found is None:
                raise
            from theinference.output.report import print_error

            print_error(found[0])
            raise typer.Exit(found[1]) from None

    return run


def register(command, name: str | None = None) -> None:
    app.command(name=name)(handled(command))


register(init.init)
register(test.test)
register(stages.stages)
register(stages.hint)
register(verify.verify)
register(bench.bench)


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


register(classroom.grade)
app.add_typer(classroom.gradebook_app, name="gradebook")
app.add_typer(gradescope.gradescope_app, name="gradescope")
register(class_report.report)
register(class_report.summary)
app.add_typer(class_report.workflow_app, name="workflow")


def main() -> None:
    app()
