"""Options several commands share, and how every command is registered: its help shown as
written, and one way out for the errors a user can fix (a message on stderr and the exit code
`exit_codes` or an `exits.Abort` gives, never a traceback)."""

import functools
from pathlib import Path
from typing import Annotated

import typer

from theinference import exits


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
        except typer.Exit:  # every command's way out: no user error to look for
            raise
        except Exception as exc:
            found = user_error(exc)
            if found is None:
                raise
            from theinference.output.report import print_error

            print_error(found[0])
            raise typer.Exit(found[1]) from None

    return run


class CommandGroup(typer.Typer):
    """Commands whose help is shown as written (rich markup off: a "[grading]" in an option's
    help stays in it instead of being read as a style) and whose user errors are handled."""

    def command(self, *args, **kwargs):
        register = super().command(*args, **kwargs)
        return lambda function: register(handled(function))


def command_group(help: str, **settings) -> CommandGroup:
    return CommandGroup(help=help, rich_markup_mode=None, no_args_is_help=True, **settings)

CourseDir = Annotated[
    Path, typer.Option("--course-dir", "-C", help="The course directory (default: here).")
]
WeightsOpt = Annotated[
    str | None,
    typer.Option(
        "--weights",
        help="synthetic | gpt2 | path/to/model.safetensors "
        "(default: theinference.toml's weights, else synthetic).",
    ),
]
StageOpt = Annotated[
    list[str] | None,
    typer.Option("--stage", "-s", help="A stage slug; repeat for several (default: all)."),
]
