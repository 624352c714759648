"""`theinference report`, `workflow matrix` and `summary`: the class report and GitHub
Actions workflows (class_report.py, workflow.py)."""

import json
from pathlib import Path
from typing import Annotated

import typer

from theinference import exits
from theinference.commands.grade import fail
from theinference.commands.options import command_group


def report(
    results: Annotated[Path, typer.Argument(help="A results folder from grade or merge.")],
    html: Annotated[Path, typer.Option("--html", help="The page to write.")] = Path("class.html"),
) -> None:
    """The class report: pass rate and common bugs per stage, error and run-time
    distributions, and a page per student. Static HTML with inline SVG."""
    from theinference.classroom.class_report import write_report
    from theinference.classroom.records import read_records

    records = read_records(results)
    if not records:
        raise fail(f"{results} holds no graded submissions (run theinference grade)", exits.USAGE)
    written = write_report(records, html)
    typer.echo(f"{html} ({len(records)} students; {len(written) - 1} student pages)")


workflow_app = command_group("GitHub Actions workflows.")


@workflow_app.command("matrix")
def matrix(
    shards: Annotated[int, typer.Option(help="Parallel jobs.")] = 4,
    submissions: Annotated[str, typer.Option(help="The submissions folder.")] = "submissions",
    course: Annotated[str, typer.Option(help="The folder with theinference.toml.")] = "course",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Default: stdout.")] = None,
) -> None:
    """A workflow grading a class as a matrix of `grade --shard I/N` jobs, then merging."""
    from theinference.atomic import atomic_write
    from theinference.classroom.workflow import matrix_workflow

    if shards < 1:
        raise fail("--shards must be at least 1", exits.USAGE)
    text = matrix_workflow(shards, submissions, course)
    if out is None:
        typer.echo(text, nl=False)
    else:
        atomic_write(out, text)
        typer.echo(f"wrote {out}", err=True)


def summary(
    results: Annotated[Path, typer.Argument(help="A `theinference test --json` file.")],
) -> None:
    """The stage table in markdown (for a CI job summary)."""
    from theinference.classroom.workflow import stage_table_markdown

    try:
        data = json.loads(results.read_text())
    except (OSError, ValueError) as exc:
        raise fail(f"cannot read {results}: {exc}", exits.USAGE) from None
    typer.echo(stage_table_markdown(data), nl=False)


def add_ci(directory: Path, ci: str) -> Path:
    """`init --ci github`: the student's workflow, beside the course."""
    from theinference.atomic import atomic_write
    from theinference.classroom.workflow import STUDENT_WORKFLOW_PATH, student_workflow

    if ci != "github":
        raise fail(f"--ci knows only 'github', not {ci!r}", exits.USAGE)
    path = directory / STUDENT_WORKFLOW_PATH
    if path.exists():
        raise fail(f"{path} exists: not overwriting it", exits.COURSE)
    atomic_write(path, student_workflow())
    return path
