"""The command line: one module per command (theinference/commands/), registered here.

Heavy imports (NumPy, the oracle, rich) happen inside command bodies so `--help` is instant.
An error the user can fix becomes one message on stderr and its exit code (exits.py), never a
traceback: every command is wrapped by commands/options.py's `handled`, and `exit_codes` there
or an `exits.Abort` a command raises are the only places that decide which code.
"""

import os

import typer

from theinference import __version__
from theinference.commands import bench, gradebooks, gradescope, init, stages, test, verify
from theinference.commands import grade as classroom
from theinference.commands import report as class_report
from theinference.commands.bytecode import compiled_once
from theinference.commands.options import command_group

app = command_group(
    "Grade a KV cache for GPT-2, stage by stage, against a NumPy recompute oracle.",
    add_completion=False,
)


def register(command, name: str | None = None) -> None:
    app.command(name=name)(command)


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
app.add_typer(gradebooks.gradebook_app, name="gradebook")
app.add_typer(gradescope.gradescope_app, name="gradescope")
register(class_report.report)
register(class_report.summary)
app.add_typer(class_report.workflow_app, name="workflow")


def main() -> None:
    one_blas_thread()
    compiled_once()
    app()


def one_blas_thread() -> None:
    """The grader's own BLAS on one thread, as the student's process has, unless told
    otherwise (a class job's share, the user's setting). The oracle's products beside a
    running student mostly decode one row at a time: more threads spin against the student's
    process for a core and made them several times slower on a loaded 2-core machine. Set
    before NumPy loads, which no command has done yet."""
    for name in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "1")
