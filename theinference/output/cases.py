"""A case in the terminal report: its line, and for one that did not pass its error or
message, step and token strips, allclose tables, hint and output."""

import math
import re

from rich.console import Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from theinference.results import CaseResult, StageResult, Status
from theinference.results.compare import OVER_SWAPPED, Comparison

STYLE = {
    Status.PASSED: ("✓", "green"),
    Status.FAILED: ("✗", "red"),
    Status.ERROR: ("!", "red"),
    Status.TIMEOUT: ("⏱", "red"),
    Status.TODO: ("○", "yellow"),
    Status.SKIPPED: ("-", "dim"),
}


def indented(renderable) -> Padding:
    return Padding(renderable, (0, 0, 0, 6), expand=False)


def case_block(case: CaseResult, repeat_of: str | None = None, show_hint: bool = True):
    mark, colour = STYLE[case.status]
    line = Text.assemble(("  " + mark + " ", colour), case.name)
    if case.status == Status.PASSED:
        line.append(f"  {passed_summary(case)} · {case.student_seconds:.2f} s", style="dim")
        return line
    line.append(f"  {case.status.value}", style=colour)
    parts: list = [line]
    if repeat_of is not None:
        parts.append(indented(Text(f"{case.message} (the same traceback as {repeat_of})")))
    else:
        parts += case_details(case, show_hint)
    return Group(*parts)


def case_details(case: CaseResult, show_hint: bool = True) -> list:
    """What a case that did not pass shows: its error or message, strips, tables, output."""
    parts: list = []
    if case.traceback:  # its last line is Python's message; ours when it says more
        parts.append(indented(Text(case.traceback.rstrip(), style="red")))
        last = case.traceback.rstrip().splitlines()[-1].strip()
        if case.message and last not in case.message:
            parts.append(indented(Text(case.message)))
    elif case.message:
        parts.append(indented(Text(case.message)))
    if case.steps:
        parts.append(indented(step_strip(case.steps)))
    if case.tokens and case.tokens.get("first_divergence") is not None:
        parts.append(indented(token_strip(case.tokens)))
    for comparison in case.comparisons:
        parts.append(indented(comparison_table(comparison)))
    if case.hint and show_hint:
        parts.append(indented(Text("hint: " + case.hint, style="cyan")))
    for name, text in (("stdout", case.stdout), ("stderr", case.stderr)):
        if text.strip():
            parts.append(indented(Text(f"your {name}:\n{text.rstrip()}", style="dim")))
    return parts


def passed_summary(case: CaseResult) -> str:
    if case.tokens is not None:
        ties = len(case.tokens.get("near_ties", []))
        extra = f", {ties} near-tie(s) accepted" if ties else ""
        return f"{len(case.tokens['yours'])} tokens match the recompute{extra}"
    if not case.comparisons:
        return case.message or "as expected"
    worst = max(case.comparisons, key=lambda c: c.worst)
    steps = f" over {len(case.steps)} steps" if case.steps else ""
    noise = f" ({worst.noise_multiple:.2g}x the float32 noise)" if worst.noise else ""
    return f"worst error {worst.worst:.2g}x tolerance{steps}{noise}"


SPARKS = "▁▂▃▄▅▆▇█"


def step_strip(steps: list[float]) -> Group:
    """Pass/fail per step, then each step's worst error on a log scale (1 = the tolerance)."""
    marks = Text("steps  ")
    for worst in steps:
        marks.append("✓" if worst <= 1 else "✗", style="green" if worst <= 1 else "red")
    logs = [math.log10(max(s, 1e-4)) for s in steps]
    low, high = min(logs), max(max(logs), 0.0)
    span = (high - low) or 1.0
    chart = Text("error  ")
    for worst, lg in zip(steps, logs, strict=True):
        chart.append(
            SPARKS[round((lg - low) / span * (len(SPARKS) - 1))],
            style="green" if worst <= 1 else "red",
        )
    chart.append(f"  {min(steps):.2g}x .. {max(steps):.2g}x the tolerance (log scale)", style="dim")
    return Group(marks, chart)


def token_strip(tokens: dict) -> Table:
    """Your tokens against the recompute's around the first divergence."""
    first = tokens["first_divergence"]
    lo, hi = max(first - 4, 0), min(first + 3, len(tokens["yours"]))
    t = Table(show_header=False, box=None, padding=(0, 1, 0, 0))
    t.add_column(style="dim")
    for _ in range(lo, hi):
        t.add_column(justify="right")
    for name, row in (("yours", tokens["yours"]), ("recompute", tokens["expected"])):
        cells = [Text(str(row[i]), style="bold red" if i == first else "") for i in range(lo, hi)]
        t.add_row(name, *cells)
    t.add_row("step", *[Text(str(i), style="dim") for i in range(lo, hi)])
    return t


def comparison_table(c: Comparison) -> Table:
    t = Table(show_header=False, box=None, padding=(0, 2, 0, 0))
    t.add_column(style="dim")
    t.add_column()
    t.add_row("compared", f"{c.label} {list(c.shape)}")
    t.add_row("mismatched", f"{c.mismatched} / {c.total} ({c.mismatched_percent:.1f}%)")
    t.add_row("max abs diff", f"{c.max_abs:.4g} at {list(c.max_abs_index)}")
    t.add_row("max rel diff", f"{c.max_rel:.4g} at {list(c.max_rel_index)}")
    t.add_row("worst", f"{c.worst:.3g}x the tolerance at {list(c.worst_index)}")
    if c.argmax_expected is not None:
        t.add_row("argmax", f"yours {c.argmax_actual}, expected {c.argmax_expected} "
                  f"({argmax_agrees(c)})")
    t.add_row("tolerance", str(c.tolerance))
    if c.noise is not None:
        t.add_row("float32 noise", noise_words(c))
    return t


def argmax_agrees(c: Comparison) -> str:
    """Whether the answer's next token is the recompute's."""
    return "same" if c.argmax_actual == c.argmax_expected else "DIFFERENT"


def noise_words(c: Comparison) -> str:
    """The floor, and the answer's distance as a multiple of it (none of a floor of 0)."""
    if c.noise_multiple is None:
        return "0: a correct cached path gives the recompute's very numbers here"
    return f"{c.noise:.3g}, a correct cached path's drift; yours is {c.noise_multiple:.3g}x that"


def same_way(case: CaseResult, diagnosed: bool = False) -> tuple | None:
    """What failing "the same way" means: numbers that failed the same comparisons (same
    labels, same kind of answer, same hint). Where the stage's diagnosis speaks for the case
    (`diagnosed`), its own hint is not shown and an answer over the swapped cache is the same
    answer as over the student's own: the diagnosis read the smaller cases. None for a case
    shown on its own: an error, or one whose output the student printed (shown with it)."""
    if case.status != Status.FAILED or not case.comparisons or case.traceback:
        return None
    if case.stdout.strip() or case.stderr.strip():
        return None
    if not diagnosed:
        labels = tuple(c.label for c in case.comparisons)
        return labels, case.steps is None, case.tokens is None, case.hint
    labels = tuple(c.label.removesuffix(OVER_SWAPPED) for c in case.comparisons)
    return labels, case.steps is None, case.tokens is None


def grouped(stage: StageResult) -> list[tuple[CaseResult, list[CaseResult]]]:
    """Each case shown in full with the later cases that fail the same way as it."""
    groups: list[tuple[CaseResult, list[CaseResult]]] = []
    first_of: dict[tuple, list[CaseResult]] = {}
    for case in stage.cases:
        kind = same_way(case, stage.speaks_for(case))
        if kind in first_of:
            first_of[kind].append(case)
            continue
        groups.append((case, []))
        if kind is not None:
            first_of[kind] = groups[-1][1]
    return groups


def alike_block(cases: list[CaseResult]) -> Group:
    """Cases that fail as the one above: one row each, its own worst figures."""
    mark, colour = STYLE[Status.FAILED]
    said = Text.assemble((f"  {mark} ", colour), f"{len(cases)} more failed the same way")
    t = Table(show_header=False, box=None, padding=(0, 2, 0, 0))
    for _ in range(5):
        t.add_column()
    for case in cases:
        worst = max(case.comparisons, key=lambda c: c.worst)
        argmax = "" if worst.argmax_expected is None else f"argmax {argmax_agrees(worst)}"
        swapped = "K/V swapped" if worst.label.endswith(OVER_SWAPPED) else ""
        t.add_row(case.name, f"worst {worst.worst:.3g}x",
                  f"{worst.mismatched_percent:.1f}% outside", argmax, swapped)
    return Group(said, indented(t))


STUB = re.compile(r"([a-z]+(?:-[a-z]+)+): ")  # a stub's message starts with its stage's slug


def not_started(stage: StageResult) -> str:
    """A todo stage's line: its first todo case's message, the stub its adapter reached. A stub
    of another stage (an earlier one, not written yet) is said to come first, not shown as this
    stage's own."""
    todo = next((c for c in stage.cases if c.status == Status.TODO), None)
    message = todo.message if todo is not None else ""
    found = STUB.match(message)
    if found is None or found.group(1) == stage.slug:
        return f"not started: {message}"
    return (f"not started: {found.group(1)} comes first ({message[found.end():]}), then this "
            "stage's own functions")
