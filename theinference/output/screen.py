"""Watch mode's screen: the current state, not a log (rustlings' manner).

Every run redraws it. Passed stages and cases collapse to one line each; the stage's verdict,
its suspected bug with the hint, the first failing case in full (its allclose table) and the
next thing to do are pinned at the bottom, the last thing the eye lands on.
"""

from rich.console import Console, Group
from rich.text import Text

from theinference.output.heatmap import map_lines
from theinference.output.report import (
    STYLE,
    case_details,
    indented,
    next_step_line,
    stage_head,
    summary_line,
)
from theinference.results import CaseResult, RunResult, StageResult, Status
from theinference.results.text import inert_copy, terminal_text

KEYS = "r: rerun · a: all stages · n: next stage · h: hint · q: quit"
OUTPUT_LINES = 12  # the student's captured output shown on the screen; the log form has all


def draw(out: Console, header: Group, run: RunResult, order: list[str], keys: bool) -> None:
    """The whole screen for a finished run, cleared first when out is a terminal."""
    run = inert_copy(run, terminal_text)  # the student's text shown, never acted on
    if out.is_terminal:
        out.clear()
    out.print(header)
    for stage in run.stages:
        out.print(stage_summary(stage))
    focus = next((s for s in run.stages if s.status != Status.PASSED), None)
    out.print(Text(""))
    if focus is not None:
        out.print(focus_block(focus))
    for note in run.notes:
        out.print(Text("note: " + note, style="yellow"))
    out.print(summary_line(run))
    out.print(verdict_block(focus, run, order))
    out.print(Text(f"watching for changes · {KEYS if keys else KEYS + ' (then Enter)'}", "dim"))


def stage_summary(stage: StageResult) -> Group:
    """A stage in a few lines: passed cases in one, each other case in one."""
    stage = inert_copy(stage, terminal_text)
    head = stage_head(stage)
    if stage.status in (Status.PASSED, Status.SKIPPED) or not stage.cases:
        return Group(head, *([Text(f"    {stage.reason}", "dim")] if stage.reason else []))
    passed = [c.name for c in stage.cases if c.status == Status.PASSED]
    lines = [head]
    if passed:
        lines.append(Text(f"    ✓ {len(passed)} passed: {', '.join(passed)}", "green"))
    others = [c for c in stage.cases if c.status != Status.PASSED]
    if stage.shared_error:  # one line for them all
        lines.append(case_line(others[0], f"{len(others)} cases"))
        return Group(*lines)
    lines += [case_line(case) for case in others]
    return Group(*lines)


def case_line(case: CaseResult, name: str = "") -> Text:
    mark, colour = STYLE[case.status]
    first = (case.message or "").strip().splitlines()[:1]
    line = Text.assemble((f"    {mark} {name or case.name}", colour), f"  {case.status.value}")
    if first:
        line.append(f": {first[0]}", style="dim")
    line.no_wrap, line.overflow = True, "ellipsis"
    return line


def focus_block(stage: StageResult) -> Group:
    """The first case that did not pass, in full (an error every case shares, once)."""
    if stage.status in (Status.TODO, Status.SKIPPED):
        return Group()
    case = stage.case(stage.first_case)
    if case is None:
        return Group()
    title = "every case" if stage.shared_error else f"case {case.name}"
    rule = Text(f"── {stage.slug} · {title} " + "─" * 20, style="dim")
    return Group(rule, *case_details(trim_output(case), show_hint=False), *map_lines(stage))


def trim_output(case: CaseResult) -> CaseResult:
    from dataclasses import replace

    def tail(text: str) -> str:
        lines = text.rstrip().splitlines()
        cut = len(lines) - OUTPUT_LINES
        return "\n".join(([f"... ({cut} lines above)"] if cut > 0 else []) + lines[-OUTPUT_LINES:])

    return replace(case, stdout=tail(case.stdout), stderr=tail(case.stderr))


def verdict_block(focus: StageResult | None, run: RunResult, order: list[str]) -> Group:
    """The last lines: the verdict, the suspected bug with its hint, what to do next."""
    if focus is None:
        last = run.stages[-1] if run.stages else None
        head = Text.assemble(("✓ ", "green"), (last.slug if last else "", "bold green"))
        head.append("  PASSED", style="bold green")
        return Group(head, Text(next_step_line(run, order) + " · press n to go there", "bold"))
    mark, colour = STYLE[focus.status]
    head = Text.assemble((f"{mark} {focus.slug}  ", f"bold {colour}"))
    head.append(focus.status.value.upper(), style=f"bold {colour}")
    lines = [head]
    if focus.status == Status.TODO:
        todo = next(c for c in focus.cases if c.status == Status.TODO)
        lines.append(Text(f"not started: {todo.message}", "yellow"))
        lines.append(Text(f"next: write it, then save · h: {focus.slug}'s guidance", "bold"))
        return Group(*lines)
    if focus.status == Status.SKIPPED:
        return Group(head, Text(focus.reason, "dim"))
    if (worst := focus.case(focus.worst_case)) is not None:
        lines.append(Text(f"worst case: {worst.name}, {worst.worst:.3g}x the tolerance"))
    if focus.bug_name:
        lines.append(Text(f"suspected bug: {focus.bug_name}", "bold magenta"))
    if focus.hint:
        lines.append(Text("hint: " + focus.hint, "cyan"))
    lines.append(Text("next: fix it and save · h: the stage's guidance", "bold"))
    return Group(*lines)


def hint_block(slug: str, title: str, guidance: str, stage: StageResult | None) -> Group:
    """Key h: the stage's guidance from the course, and the diagnosis of its last run."""
    parts = [Text(f"── hint: {slug} · {title} ──", "bold cyan"), Text(guidance)]
    stage = inert_copy(stage, terminal_text)
    if stage is not None and stage.status not in (Status.PASSED, Status.TODO, Status.SKIPPED):
        if stage.bug_name:
            parts.append(Text(f"your last run: suspected bug: {stage.bug_name}", "magenta"))
        if stage.hint:
            parts.append(indented(Text(stage.hint, "cyan")))
    return Group(*parts)


def header(course: str, weights: str, trigger: str) -> Group:
    import time

    when = time.strftime("%H:%M:%S")
    course, weights, trigger = map(terminal_text, (course, weights, trigger))  # file names
    return Group(
        Text.assemble(("theinference", "bold"), f" · course {course} · weights {weights}"),
        Text(f"{trigger or 'first run'} · {when}", "dim"),
    )


class WatchScreen:
    """One watched run on the screen: cleared at its start, the header, a live status line
    and each stage collapsed as it finishes; redrawn whole when the run is over."""

    def __init__(self, out: Console, session, keys: bool):
        from theinference.output.terminal import LiveStatus

        self.out = out
        self.course = str(session.course.root)
        self.weights = session.weights.label
        self.order = [s.slug for s in session.all_stages]
        self.keys = keys
        self.status = LiveStatus(out)
        self.top = Group()

    def listener(self, trigger: str, cancel):
        from theinference.output.terminal import RunProgress, tee
        from theinference.results.events import RunStarted

        self.top = header(self.course, self.weights, trigger)

        def stage_done(stage: StageResult) -> None:
            if not cancel.is_set():  # a stopped run's last stage is the kill, not a verdict
                self.out.print(stage_summary(stage))

        def clear_first(event) -> None:
            if isinstance(event, RunStarted):
                self.out.clear()
                self.out.print(self.top)

        return tee(clear_first, RunProgress(self.status, on_stage=stage_done))

    def draw(self, run: RunResult) -> None:
        draw(self.out, self.top, run, self.order, self.keys)

    def close(self) -> None:
        self.status.stop()
