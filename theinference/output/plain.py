"""One case as the terminal's log form shows it, in plain text: what the pytest plugin reports
for a case that did not pass (pytest prints it as the failure, and into --junitxml)."""

import textwrap
from io import StringIO

from rich.console import Console, Group
from rich.text import Text

from theinference.output.report import UNLIMITED, case_details, diagnosis_lines
from theinference.results import StageResult, Status
from theinference.results.text import inert_copy, terminal_text


def not_started(stage: StageResult) -> str:
    """What a todo stage says in the log form: its first case's message."""
    first = stage.cases[0].message if stage.cases else ""
    return f"not started: {terminal_text(first)}"


def case_text(stage: StageResult, name: str) -> str:
    """The case's details (its error or allclose tables, its hint, its output) and the stage's
    diagnosis (worst case, suspected bug or the error's lesson, hint), as the log form says
    them under the case's line, without colour and never hard-wrapped. The first line says
    what went wrong: pytest's summary and junit.xml's message show it."""
    stage = inert_copy(stage, terminal_text)  # the student's text shown, never acted on
    case = stage.case(name)
    if case is None or case.status == Status.TODO:
        return not_started(stage)
    parts = [plain(case_details(case)), plain(diagnosis_lines(stage))]
    return "\n".join(part for part in parts if part)


def plain(renderables: list) -> str:
    """Rich renderables as plain text at the left margin: no colour, never hard-wrapped."""
    out = Console(
        file=StringIO(), width=UNLIMITED, no_color=True, highlight=False, soft_wrap=True,
        force_terminal=False, emoji=False,
    )
    out.print(Group(*renderables, Text("")))
    lines = [line.rstrip() for line in out.file.getvalue().splitlines()]
    return textwrap.dedent("\n".join(lines)).strip("\n")
