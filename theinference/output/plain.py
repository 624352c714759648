"""One case as the terminal's log form shows it, in plain text: what the pytest plugin reports
for a case that did not pass (pytest prints it as the failure, and into --junitxml)."""

import textwrap
from io import StringIO

from rich.console import Console, Group
from rich.text import Text

from theinference.output.cases import not_started
from theinference.output.consoles import UNLIMITED
from theinference.output.report import case_details, diagnosis_lines
from theinference.results import StageResult, Status
from theinference.results.text import inert_copy, terminal_text


def not_started_text(stage: StageResult) -> str:
    """What a todo stage says in the log form (its stub's message), made inert."""
    return not_started(inert_copy(stage, terminal_text))


def case_text(stage: StageResult, name: str, told_under: str = "") -> str:
    """The case's details (its error or allclose tables, its hint, its output) and the stage's
    diagnosis (suspected bug or the error's lesson, hint, worst case), as the log form says
    them, without colour and never hard-wrapped. The first line is what pytest's summary and
    junit.xml's message show: the suspected bug where one is named, else what went wrong.
    `told_under`: the case whose text already gave the diagnosis (then only the bug is said)."""
    stage = inert_copy(stage, terminal_text)  # the student's text shown, never acted on
    case = stage.case(name)
    if case is None or case.status == Status.TODO:
        return not_started(stage)
    first = f"suspected bug: {stage.bug_name}" if stage.bug_name else ""
    if told_under:
        diagnosis = f"the stage's diagnosis: under {told_under}"
    else:
        diagnosis = plain(diagnosis_lines(stage, with_bug=not first))
    details = plain(case_details(case, show_hint=not stage.speaks_for(case)))
    return "\n".join(part for part in (first, details, diagnosis) if part)


def plain(renderables: list) -> str:
    """Rich renderables as plain text at the left margin: no colour, never hard-wrapped."""
    out = Console(
        file=StringIO(), width=UNLIMITED, no_color=True, highlight=False, soft_wrap=True,
        force_terminal=False, emoji=False,
    )
    out.print(Group(*renderables, Text("")))
    lines = [line.rstrip() for line in out.file.getvalue().splitlines()]
    return textwrap.dedent("\n".join(lines)).strip("\n")
