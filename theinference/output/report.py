"""The terminal report, in the log form: it reads results (the diagnosis included) and draws
them; it works nothing out."""

import math
import os

from rich.console import Console, Group
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from theinference.output.heatmap import map_lines
from theinference.results import CaseResult, RunResult, StageResult, Status
from theinference.results.compare import Comparison
from theinference.results.text import inert_copy, terminal_text

STYLE = {
    Status.PASSED: ("✓", "green"),
    Status.FAILED: ("✗", "red"),
    Status.ERROR: ("!", "red"),
    Status.TIMEOUT: ("⏱", "red"),
    Status.TODO: ("○", "yellow"),
    Status.SKIPPED: ("-", "dim"),
}


UNLIMITED = 10_000  # columns when stdout is not a terminal: a log is never hard-wrapped


def console(stderr: bool = False) -> Console:
    """A terminal wraps at its width, by words; so does a pipe given a width by COLUMNS. A pipe
    given none keeps its lines whole (soft wrap, no width), so a log is never cut at 80. (A
    soft-wrapped console with a width would crop what is indented, hints included.)"""
    out = Console(stderr=stderr, highlight=False)
    if not out.is_terminal and not os.environ.get("COLUMNS"):
        out = Console(stderr=stderr, highlight=False, soft_wrap=True, width=UNLIMITED)
    return out


def print_header(
    out: Console, course: str, weights: str, stages: list[str], trigger: str = ""
) -> None:
    course, weights, trigger = map(terminal_text, (course, weights, trigger))  # file names
    if trigger and out.is_terminal:
        out.rule(escape(trigger), style="dim")
    elif trigger:
        out.print(Text(f"── {trigger} ──", style="dim"))
    out.print(f"[bold]theinference[/] · course {escape(course)} · weights {escape(weights)}")
    out.print(f"[dim]stages: {', '.join(stages)}[/]")


def print_run(out: Console, run: RunResult, next_step: str = "") -> None:
    seen: dict[str, str] = {}
    for stage in run.stages:
        out.print(stage_block(stage, seen))
    print_run_end(out, run, next_step)


def print_run_end(out: Console, run: RunResult, next_step: str = "") -> None:
    run = inert_copy(run, terminal_text)
    for note in run.notes:
        out.print(Text("note: " + note, style="yellow"))
    out.print(summary_line(run))
    if next_step:
        out.print(Text(next_step, style="bold"))


def print_cancelled(out: Console, reason: str) -> None:
    out.print(Text(f"run stopped: {reason}", style="dim"))


def print_watching(out: Console, keys: bool) -> None:
    how = "r or Enter: rerun · a: all stages · n: next stage · h: hint · q: quit"
    out.print(Text(f"watching for changes · {how if keys else how + ' (then Enter)'}", style="dim"))


def stage_head(stage: StageResult) -> Text:
    mark, colour = STYLE[stage.status]
    passed = sum(c.status == Status.PASSED for c in stage.cases)
    head = Text.assemble(
        (f"{mark} {stage.slug}", f"bold {colour}"),
        f"  {stage.title}  ",
        (stage.status.value.upper(), colour),
    )
    if stage.status != Status.SKIPPED:
        # left out by --quick or --case, or after a first failure in watch mode
        partial = f" ({len(stage.not_run)} not run)" if stage.partial and stage.not_run else ""
        head.append(
            f"  {passed}/{len(stage.cases)} cases{partial} · {stage.seconds:.1f} s", style="dim"
        )
    return head


def stage_block(stage: StageResult, seen: dict[str, str] | None = None) -> Group:
    """A stage in the log form. `seen` (traceback -> where it was first shown) spans the run,
    so an error every case shares is shown once per stage, and an import failure once per run."""
    seen = {} if seen is None else seen
    stage = inert_copy(stage, terminal_text)  # the student's text shown, never acted on
    head = stage_head(stage)
    if stage.status == Status.SKIPPED:
        return Group(Text(""), head, Text(f"    {stage.reason}", style="dim"))
    if stage.status == Status.TODO and all(c.status == Status.TODO for c in stage.cases):
        return Group(
            Text(""), head, Text(f"    not started: {stage.cases[0].message}", style="yellow")
        )
    if stage.shared_error:
        return Group(Text(""), head, *shared_error_block(stage, seen))
    blocks, hints = [], set()
    for case in stage.cases:
        blocks.append(case_block(case, seen.get(case.traceback), show_hint=case.hint not in hints))
        hints.add(case.hint)
        if case.traceback:
            seen.setdefault(case.traceback, f"'{case.name}'")
    return Group(Text(""), head, *blocks, *diagnosis_lines(stage), *map_lines(stage))


def shared_error_block(stage: StageResult, seen: dict[str, str]) -> list:
    errors = [c for c in stage.cases if c.status == Status.ERROR]
    shared = (errors[0].traceback or errors[0].message).strip()
    names = "; ".join(c.name for c in errors)  # case names may hold commas
    said = Text(f"    every case that ran ({len(errors)}: {names}) raised the same error", "red")
    if shared in seen:
        return [said, indented(Text(f"{errors[0].message} (shown above, {seen[shared]})"))]
    seen[shared] = f"stage {stage.slug}"
    return [said, *case_details(errors[0], show_hint=False), *diagnosis_lines(stage)]


def diagnosis_lines(stage: StageResult) -> list:
    """The stage's diagnosis: the suspected bug and its hint, and the worst case."""
    if stage.status in (Status.PASSED, Status.TODO, Status.SKIPPED):
        return []
    lines = []
    if (worst := stage.case(stage.worst_case)) is not None:
        lines.append(Text(f"    worst case: {worst.name}, {worst.worst:.3g}x the tolerance"))
    if stage.bug_name:
        lines.append(Text(f"    suspected bug: {stage.bug_name}", style="bold magenta"))
    elif stage.diagnosed:
        lines.append(Text("    no known bug matches these answers", style="dim"))
    if stage.hint:
        lines.append(indented(Text("hint: " + stage.hint, style="cyan")))
    return lines


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
        same = "same" if c.argmax_actual == c.argmax_expected else "DIFFERENT"
        t.add_row("argmax", f"yours {c.argmax_actual}, expected {c.argmax_expected} ({same})")
    t.add_row("tolerance", str(c.tolerance))
    if c.noise is not None:
        t.add_row(
            "float32 noise",
            f"{c.noise:.3g}: a correct cached path differs this much; "
            f"yours differs {c.noise_multiple:.3g}x that",
        )
    return t


def summary_line(run: RunResult) -> Text:
    counts: dict[Status, int] = {}
    for s in run.stages:
        counts[s.status] = counts.get(s.status, 0) + 1
    parts = [f"{n} {status.value}" for status, n in counts.items()]
    colour = "green" if run.passed else "red"
    return Text.assemble(
        ("\n" + ("PASSED" if run.passed else "NOT PASSED"), f"bold {colour}"),
        f" · {', '.join(parts)} · weights {run.weights_label} · sandbox {run.sandbox}"
        f" · {run.seconds:.1f} s",
    )


def print_notice(message: str) -> None:
    """A wait about to begin (the weights being made), on stderr: stdout may be a result."""
    console(stderr=True).print(Text(terminal_text(message), style="dim"), soft_wrap=True)


def print_error(message: str) -> None:
    # never hard-wrapped: paths in it must survive copy and paste
    line = Text("error: ", style="bold red") + Text(terminal_text(message))
    console(stderr=True).print(line, soft_wrap=True)


def next_stage(run: RunResult, order: list[str]) -> str | None:
    """The stage after the last one this run graded, when every stage it graded passed."""
    if not run.stages or not run.passed:
        return None
    last = order.index(run.stages[-1].slug) if run.stages[-1].slug in order else -1
    return order[last + 1] if last + 1 < len(order) else None


def next_step_line(run: RunResult, order: list[str]) -> str:
    """What to do once everything graded passed ("" while something fails)."""
    if not run.stages or not run.passed:
        return ""
    following = next_stage(run, order)
    if following is None:
        return "every stage passes: the KV cache is complete"
    return f"next stage: {following} · theinference test --stage {following} --watch"
