"""What the instructor's commands show in the terminal: the grading progress bar and the
class summary table."""

from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from theinference.results import Status
from theinference.results.submission import Record
from theinference.results.text import terminal_text

STATUS_STYLE = {"graded": "green", "rejected": "yellow", "grader-error": "red"}


def console() -> Console:
    return Console(stderr=True)


@contextmanager
def grading_progress(total: int, reused_label: str = "unchanged"):
    """A bar with ETA; yields on_done(record, reused) to call as each submission finishes."""
    progress = Progress(
        TextColumn("[bold]grading"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        TextColumn("{task.description}"),
        console=console(),
    )
    with progress:
        task = progress.add_task("", total=total)

        def on_done(record: Record, reused: bool) -> None:
            note = reused_label if reused else record.status
            score = f"{record.score:g}/{record.max_score:g}"
            line = f"{terminal_text(record.id)}: {note} {score}"
            progress.update(task, advance=1, description=escape(line))

        yield on_done


def print_class_summary(records: list[Record], reused: int, gradebook: str) -> None:
    out = console()
    table = Table(title=f"{len(records)} submissions ({reused} unchanged, not regraded)")
    for column in ("student", "status", "score", "stages passed", "suspected bugs"):
        table.add_column(column)
    for r in records:
        passed = sum(s.status == Status.PASSED for s in r.rows)
        bugs = ", ".join(s.suspected_bug for s in r.rows if s.suspected_bug)
        style = STATUS_STYLE.get(r.status, "")
        # a student id is a file name and a message may quote one: text, never markup
        table.add_row(Text(terminal_text(r.id)), Text(r.status, style),
                      f"{r.score:g}/{r.max_score:g}", f"{passed}/{len(r.rows)}",
                      Text(terminal_text(bugs or r.message[:60])))
    out.print(table)
    out.print(Text(f"gradebook: {terminal_text(gradebook)}"))
